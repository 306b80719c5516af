package cli

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// What get and describe say about a lock's Lease against its status (the
// STATUS column of get).
const (
	// stateInSync: the Lease and the controller's status agree.
	stateInSync = "InSync"
	// stateStale: the Lease moved on and the controller has not recorded it.
	stateStale = "Stale"
	// stateLeaseMissing: the lock's Lease does not exist.
	stateLeaseMissing = "LeaseMissing"
	// stateLeaseUnreadable: reading the Lease failed (e.g. forbidden).
	stateLeaseUnreadable = "LeaseUnreadable"
	// stateLeaseNotOwned: the Lease of that name is not controlled by this lock.
	stateLeaseNotOwned = "LeaseNotOwned"
	// stateLeaseDeleting: the Lease is being deleted.
	stateLeaseDeleting = "LeaseDeleting"
	// stateLeaseMalformed: the Lease names a holder but carries no token.
	stateLeaseMalformed = "LeaseMalformed"
)

// staleGrace is how long get and describe wait for the controller to catch
// up with the Lease before calling its status stale: it normally records a
// grant within milliseconds, so a status still behind after this long is
// not lag.
const staleGrace = 2 * time.Second

// lockView is a lock as `kubectl dlock get` and `describe` show it: holder
// and fencing token from its Lease, the source of truth (acquire, renew and
// release are compare-and-swap writes on it), next to the controller's view
// from the lock's status, and what is wrong when the two disagree.
type lockView struct {
	lock *locksv1alpha1.DistributedLock
	// leaseName is the Lease read: status.leaseName, else spec.leaseName,
	// else the lock's name.
	leaseName string
	// lease is the Lease, nil when it could not be read.
	lease *coordinationv1.Lease
	// leaseErr is why the Lease could not be read.
	leaseErr error
}

// leaseNameOf is the Lease behind a lock: the one the controller recorded,
// else the one the spec names, else the lock's own name.
func leaseNameOf(l *locksv1alpha1.DistributedLock) string {
	if l.Status.LeaseName != "" {
		return l.Status.LeaseName
	}
	return l.EffectiveLeaseName()
}

// leaseUsable reports whether the Lease can be shown as this lock's record:
// it was read and it is controlled by this lock.
func (v *lockView) leaseUsable() bool {
	return v.lease != nil && lease.ControllerUID(v.lease) == v.lock.UID
}

func (v *lockView) leaseHolder() string { return ptr.Deref(v.lease.Spec.HolderIdentity, "") }
func (v *lockView) leaseToken() int64   { return lease.Token(v.lease) }

// holder is who holds the lock: from the Lease when it can be used, else
// the controller's last record.
func (v *lockView) holder() string {
	if v.leaseUsable() {
		return v.leaseHolder()
	}
	return v.lock.Status.Holder
}

// token is the current fencing token: from the Lease when it can be used,
// else the controller's last record.
func (v *lockView) token() int64 {
	if v.leaseUsable() {
		return v.leaseToken()
	}
	return v.lock.Status.FencingToken
}

// state is the STATUS column: InSync, or what is wrong.
func (v *lockView) state() string {
	switch {
	case v.leaseErr != nil && apierrors.IsNotFound(v.leaseErr):
		return stateLeaseMissing
	case v.leaseErr != nil:
		return stateLeaseUnreadable
	case !v.leaseUsable():
		return stateLeaseNotOwned
	case v.lease.DeletionTimestamp != nil:
		return stateLeaseDeleting
	case v.leaseHolder() != "" && v.lease.Spec.LeaseTransitions == nil:
		return stateLeaseMalformed
	case v.staleness() != "":
		return stateStale
	default:
		return stateInSync
	}
}

// inSync reports whether the controller's status describes the Lease as it
// is now, so its Held condition and expiry apply to the holder shown.
func (v *lockView) inSync() bool {
	s := v.state()
	return s == stateInSync || (s == stateLeaseDeleting && v.staleness() == "")
}

// held is the HELD column: the controller's Held condition when its status
// describes the holder shown; when the status lags a usable Lease, False if
// the Lease has no holder and Unknown otherwise (whether that holder still
// renews is only known to someone who has watched the Lease).
func (v *lockView) held() string {
	if !v.leaseUsable() || v.inSync() {
		return conditionStatus(v.lock, locksv1alpha1.ConditionHeld)
	}
	if v.leaseHolder() == "" {
		return string(metav1.ConditionFalse)
	}
	return string(metav1.ConditionUnknown)
}

// duration is the lease duration in seconds: the Lease's, else the lock's.
func (v *lockView) duration() int32 {
	if v.lease != nil && ptr.Deref(v.lease.Spec.LeaseDurationSeconds, 0) > 0 {
		return *v.lease.Spec.LeaseDurationSeconds
	}
	return v.lock.EffectiveLeaseDurationSeconds()
}

// staleness says how the controller's status lags the Lease ("" when it
// does not, or the Lease cannot be used).
func (v *lockView) staleness() string {
	if !v.leaseUsable() {
		return ""
	}
	st := &v.lock.Status
	holder, token := v.leaseHolder(), v.leaseToken()
	shows := fmt.Sprintf("its status shows token %d, holder %s", st.FencingToken, orNone(st.Holder))
	switch {
	case token > st.FencingToken:
		return fmt.Sprintf("the controller has not recorded token %d yet (%s)", token, shows)
	case token < st.FencingToken:
		return fmt.Sprintf("the Lease's token %d is below token %d the controller recorded: the Lease was replaced and its token floor not restored yet", token, st.FencingToken)
	case holder != st.Holder && holder == "":
		return fmt.Sprintf("the controller has not recorded that %s released the lock (%s)", st.Holder, shows)
	case holder != st.Holder:
		return fmt.Sprintf("the Lease names holder %s with token %d, but %s", holder, token, shows)
	case len(st.Conditions) == 0:
		return "the controller has not reconciled this lock yet"
	}
	return ""
}

// problem is a sentence on what is wrong with the lock's Lease or status,
// and what to do; "" when nothing is.
func (v *lockView) problem() string {
	name := v.leaseName
	switch v.state() {
	case stateLeaseMissing:
		return fmt.Sprintf("Lease %s not found; the frontdesk controller creates it: is the frontdesk manager running? (showing the controller's last status)", name)
	case stateLeaseUnreadable:
		msg := fmt.Sprintf("cannot read Lease %s: %v (showing the controller's last status)", name, v.leaseErr)
		if hint := forbiddenHint(v.leaseErr, "get", v.lock.Namespace); hint != "" {
			msg += "; " + hint
		}
		return msg
	case stateLeaseNotOwned:
		return fmt.Sprintf("Lease %s is not this lock's: %s; see the lock's Ready condition (showing the controller's last status)", name, ownerOf(v.lease))
	case stateLeaseDeleting:
		return fmt.Sprintf("Lease %s is being deleted; the controller recreates it with its fencing token preserved", name)
	case stateLeaseMalformed:
		return fmt.Sprintf("Lease %s names holder %s but has no spec.leaseTransitions, so no fencing token: it was not written by a frontdesk grant; break the lock (kubectl dlock break %s) to fence it", name, v.leaseHolder(), v.lock.Name)
	case stateStale:
		return "status stale: " + v.staleness() + "; is the frontdesk manager running?"
	}
	if c := meta.FindStatusCondition(v.lock.Status.Conditions, locksv1alpha1.ConditionGuarded); c != nil && c.Status == metav1.ConditionFalse {
		return "not guarded: " + c.Message
	}
	return ""
}

// ownerOf says who controls a Lease.
func ownerOf(l *coordinationv1.Lease) string {
	if owner := lease.ForeignController(l); owner != nil {
		return fmt.Sprintf("it is controlled by %s %s (uid %s)", owner.Kind, owner.Name, owner.UID)
	}
	switch uid, name := lease.ControllerUID(l), l.Labels[locksv1alpha1.LockNameLabel]; {
	case uid != "":
		return fmt.Sprintf("it is controlled by DistributedLock %s (uid %s)", orNone(name), uid)
	case name != "":
		return fmt.Sprintf("it keeps the fencing tokens of a deleted DistributedLock %s (not adopted yet)", name)
	}
	return "no object controls it (the controller has not adopted it)"
}

// readViews reads one lock (names[0]) or every lock in namespace, and their
// Leases. obj is what was read, for -o json|yaml.
func (o *options) readViews(ctx context.Context, namespace string, names []string) (runtime.Object, []lockView, error) {
	cs, dyn, err := o.clients()
	if err != nil {
		return nil, nil, err
	}
	obj, err := fetchLocks(ctx, dyn, namespace, names)
	if err != nil {
		return nil, nil, err
	}
	locks, err := toLocks(obj)
	if err != nil {
		return nil, nil, err
	}
	views := make([]lockView, len(locks))
	for i := range locks {
		views[i] = lockView{lock: &locks[i], leaseName: leaseNameOf(&locks[i])}
	}
	readLeases(ctx, cs, namespace, views)
	return obj, views, nil
}

// readLeases fills in each view's Lease: one list for many locks, else (or
// when listing is not allowed, as for the frontdesk-lock-user role) one read
// per lock.
func readLeases(ctx context.Context, cs kubernetes.Interface, namespace string, views []lockView) {
	leases := cs.CoordinationV1().Leases(namespace)
	if len(views) > 1 {
		list, err := leases.List(ctx, metav1.ListOptions{})
		if err == nil {
			byName := make(map[string]*coordinationv1.Lease, len(list.Items))
			for i := range list.Items {
				byName[list.Items[i].Name] = &list.Items[i]
			}
			for i := range views {
				if l, ok := byName[views[i].leaseName]; ok {
					views[i].lease = l
				} else {
					views[i].leaseErr = apierrors.NewNotFound(coordinationv1.Resource("leases"), views[i].leaseName)
				}
			}
			return
		}
	}
	for i := range views {
		views[i].lease, views[i].leaseErr = leases.Get(ctx, views[i].leaseName, metav1.GetOptions{})
		if views[i].leaseErr != nil {
			views[i].lease = nil
		}
	}
}

// readViewsSettled is readViews, read again for up to staleGrace while a
// lock's status lags its Lease in a way the controller fixes within
// milliseconds when it runs: so what is reported as stale is not mere lag.
func (o *options) readViewsSettled(ctx context.Context, namespace string, names []string) (runtime.Object, []lockView, error) {
	deadline := time.Now().Add(staleGrace)
	for {
		obj, views, err := o.readViews(ctx, namespace, names)
		if err != nil || !anyCatchingUp(views) || time.Now().After(deadline) {
			return obj, views, err
		}
		select {
		case <-ctx.Done():
			return obj, views, nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// anyCatchingUp reports whether a view is in a state a running controller
// leaves quickly.
func anyCatchingUp(views []lockView) bool {
	for i := range views {
		switch views[i].state() {
		case stateStale, stateLeaseMissing:
			return true
		}
	}
	return false
}

// renewed is the Lease's renewTime as the holder wrote it, on its own clock.
func (v *lockView) renewed() string {
	if v.lease == nil || v.lease.Spec.RenewTime == nil {
		return "<none>"
	}
	return v.lease.Spec.RenewTime.UTC().Format(time.RFC3339)
}
