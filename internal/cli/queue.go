package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// queuedPlace is a waiter as describe shows it.
type queuedPlace struct {
	lease.Waiter
	// pod is the gated pod the controller queued this place for ("" for
	// any other waiter).
	pod string
	// created is that pod's creation, nil when it is not known.
	created *metav1.Time
	// gone: the pod no longer exists (or its name is a newer pod's).
	gone bool
}

// queueView is the queue of a lock's Lease, head first.
type queueView struct {
	// known: the Lease could be used, so places is the queue.
	known  bool
	places []queuedPlace
	// podErr is why the gated pods could not be read (e.g. forbidden).
	podErr error
}

// gatedPodOf is the pod a place is for, when the controller queued it for a
// lock-admitted pod: its ticket is "pod-<uid>" and its identity
// "<pod>_<uid>" with the same UID.
func gatedPodOf(w lease.Waiter) (name, uid string) {
	uid = locksv1alpha1.PodUIDOf(w.Identity)
	if uid == "" || w.Ticket != locksv1alpha1.PodTicketPrefix+uid {
		return "", ""
	}
	return locksv1alpha1.PodNameOf(w.Identity), uid
}

// readQueue is the view's queue, with the creation of each gated pod in
// it (one read per such pod; none after a read failed other than by the
// pod being gone).
func readQueue(ctx context.Context, cs kubernetes.Interface, v *lockView) queueView {
	if !v.leaseUsable() {
		return queueView{}
	}
	q := queueView{known: true}
	for _, w := range lease.Queue(v.lease) {
		p := queuedPlace{Waiter: w}
		if name, uid := gatedPodOf(w); name != "" {
			p.pod = name
			if q.podErr == nil {
				pod, err := cs.CoreV1().Pods(v.lock.Namespace).Get(ctx, name, metav1.GetOptions{})
				switch {
				case apierrors.IsNotFound(err):
					p.gone = true
				case err != nil:
					q.podErr = err
				case string(pod.UID) != uid:
					p.gone = true
				default:
					p.created = &pod.CreationTimestamp
				}
			}
		}
		q.places = append(q.places, p)
	}
	return q
}

// describeQueue prints the waiters, head first: the order in which they
// get the lock.
func describeQueue(out io.Writer, q queueView, now time.Time) error {
	switch {
	case !q.known:
		_, err := fmt.Fprintln(out, "Waiters:  <unknown> (the Lease cannot be used)")
		return err
	case len(q.places) == 0:
		_, err := fmt.Fprintln(out, "Waiters:  <none>")
		return err
	}
	fmt.Fprintf(out, "Waiters:  %d, in the order they get the lock\n", len(q.places))
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "  #\tIDENTITY\tPRINCIPAL\tPRIORITY\tSEQ\tPOD\tWAITING SINCE")
	for i, p := range q.places {
		fmt.Fprintf(w, "  %d\t%s\t%s\t%d\t%d\t%s\t%s\n", i+1, printable(p.Identity), printable(orNone(p.Principal)),
			p.Priority, p.Seq, printable(orNone(p.pod)), waitingSince(p, now))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if q.podErr != nil {
		_, err := fmt.Fprintf(out, "  (the gated pods' creation is unknown: %s)\n", printable(q.podErr.Error()))
		return err
	}
	return nil
}

// waitingSince is what is known of when a place started waiting: nothing
// for a waiter (a place records no time); for a gated pod, its creation.
func waitingSince(p queuedPlace, now time.Time) string {
	switch {
	case p.pod == "":
		return "<not recorded>"
	case p.gone:
		return "<pod gone>"
	case p.created == nil:
		return "<unknown>"
	}
	return fmt.Sprintf("%s (pod created %s ago)", p.created.UTC().Format(time.RFC3339), age(*p.created, now))
}

// waiting is get's WAITING column: how many places the Lease's queue
// holds, or <unknown> when the Lease cannot be used.
func (v *lockView) waiting() string {
	if !v.leaseUsable() {
		return "<unknown>"
	}
	return strconv.Itoa(len(lease.Queue(v.lease)))
}

// admittedPod names the pod whose grant the Lease holds when the current
// grant is one the frontdesk controller holds for a lock-admitted pod: the
// Lease's admitted-grant annotation (written by the manager only) names
// the current holder and token as "<identity>,<token>", and the identity
// is "<pod>_<uid>".
func (v *lockView) admittedPod() (name, uid string, ok bool) {
	if !v.leaseUsable() || v.leaseHolder() == "" {
		return "", "", false
	}
	mark := v.leaseHolder() + "," + strconv.FormatInt(v.leaseToken(), 10)
	if v.lease.Annotations[locksv1alpha1.AdmittedGrantAnnotation] != mark {
		return "", "", false
	}
	if uid = locksv1alpha1.PodUIDOf(v.leaseHolder()); uid == "" {
		return "", "", false
	}
	return locksv1alpha1.PodNameOf(v.leaseHolder()), uid, true
}

// admittedPodNote says that the holder is a lock-admitted pod, and which.
func admittedPodNote(pod, uid, namespace string) string {
	return fmt.Sprintf("the holder is pod %s (uid %s), admitted by the frontdesk controller, which holds the lock for it until the pod has finished: kubectl get pod %s -n %s",
		printable(pod), printable(uid), printable(pod), printable(namespace))
}

// withHolderNote adds to err, when the lock is held by a lock-admitted pod,
// which pod it is. It reads the lock and its Lease again; when that read
// fails, or the holder changed since, err is returned as it is.
func (o *options) withHolderNote(ctx context.Context, c *lock.Client, err error) error {
	held, ok := errors.AsType[*lock.HeldError](err)
	if !ok || held.Holder == "" {
		return err
	}
	// The caller's ctx may be what ended the wait.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, views, readErr := o.readViews(ctx, c.Namespace(), []string{c.Name()})
	if readErr != nil || len(views) != 1 {
		return err
	}
	v := &views[0]
	pod, uid, ok := v.admittedPod()
	if !ok || v.leaseHolder() != held.Holder {
		return err
	}
	return fmt.Errorf("%w; %s", err, admittedPodNote(pod, uid, c.Namespace()))
}
