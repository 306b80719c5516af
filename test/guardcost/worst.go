package guardcost

import (
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/user"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// The worst Lease the guard's rules allow: MaxPlaces places, every value
// as long as the grammar (pkg/lease/grammar.go) lets it be. Tickets of
// MaxTicketLength, the lowest priority (the longest number), seqs of 15
// digits, identities of MaxIdentityLength, principals of a pod and a
// username of MaxUsernameLength; as many principals and users as the
// bounds per principal and per user make a full queue need.

// WorstSeqBase is what the seqs of the worst Lease's places follow (15
// digits, the most the grammar allows, and room for every registration a
// test makes).
const WorstSeqBase = 999_999_999_000_000

// WorstUsername is a username of MaxUsernameLength, the i-th of its kind.
// It is not a ServiceAccount's: the controller looks up the pods of
// those, and removes the places of pods that are gone.
func WorstUsername(i int) string {
	prefix := fmt.Sprintf("worst-user-%03d-", i)
	return prefix + strings.Repeat("u", lease.MaxUsernameLength-len(prefix))
}

// WorstPrincipal is the principal of pod j of user i, of the longest kind.
func WorstPrincipal(i, j int) string {
	return fmt.Sprintf("pod=00000000-0000-0000-%04d-%012d user=%s", i, j, WorstUsername(i))
}

// WorstIdentity is an identity of MaxIdentityLength, the i-th of its kind.
func WorstIdentity(kind string, i int) string {
	prefix := fmt.Sprintf("%s-%03d-", kind, i)
	return prefix + strings.Repeat("i", lease.MaxIdentityLength-len(prefix))
}

// WorstTicket is a ticket of MaxTicketLength, the i-th of its kind.
func WorstTicket(kind string, i int) string {
	prefix := fmt.Sprintf("%s-%03d-", kind, i)
	return prefix + strings.Repeat("t", lease.MaxTicketLength-len(prefix))
}

// WorstQueue is n places of others (n <= MaxPlaces) of the longest values,
// spread over principals and users as the bounds per principal and per
// user require (Seq numbered from 1: SetQueue's; see WorstSeqs).
func WorstQueue(n int) []lease.Waiter {
	q := make([]lease.Waiter, n)
	for i := range q {
		q[i] = lease.Waiter{
			Ticket:    WorstTicket("place", i),
			Identity:  WorstIdentity("waiter", i),
			Priority:  lease.MinPriority,
			Principal: WorstPrincipal(i/lease.MaxPlacesPerUser, i/lease.MaxPlacesPerPrincipal),
		}
	}
	return q
}

// WorstSeqs gives the places of l's queue seqs of 15 digits (WorstSeqBase
// plus the seq each has), keeping their order.
func WorstSeqs(l *coordinationv1.Lease) error {
	for key, value := range l.Annotations {
		ticket, ok := strings.CutPrefix(key, locksv1alpha1.QueueEntryPrefix)
		if !ok {
			continue
		}
		w, ok := lease.ParsePlace(ticket, value)
		if !ok {
			return fmt.Errorf("a place outside the grammar: %s=%s", key, value)
		}
		if w.Seq < WorstSeqBase {
			l.Annotations[key] = fmt.Sprintf("%d,%d,%s", w.Priority, WorstSeqBase+w.Seq, w.Identity)
		}
	}
	return nil
}

// ManagedLease is a lock's Lease as the manager creates it (lock label,
// token finalizer, the manager's annotations), without a grant.
func ManagedLease(namespace, name string, durationSeconds int32) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace, Name: name, ResourceVersion: "1",
			Labels:     map[string]string{locksv1alpha1.LockNameLabel: name},
			Finalizers: []string{locksv1alpha1.LeaseTokenFinalizer},
			Annotations: map[string]string{
				locksv1alpha1.LockUIDAnnotation:       "00000000-0000-0000-0000-00000000beef",
				locksv1alpha1.LeaseOriginAnnotation:   "created",
				locksv1alpha1.LeaseDurationAnnotation: fmt.Sprint(durationSeconds),
			},
		},
		Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: &durationSeconds, LeaseTransitions: new(int32(7))},
	}
}

// WorstLease is ManagedLease with the worst queue of n places (MaxPlaces-1
// leaves room for one registration) and, when holder is not "", a live
// grant to holder bound to principal.
func WorstLease(namespace, name string, n int, holder, principal string) (*coordinationv1.Lease, error) {
	l := lease.SetQueue(ManagedLease(namespace, name, 15), WorstQueue(n))
	if err := WorstSeqs(l); err != nil {
		return nil, err
	}
	if holder != "" {
		var err error
		if l, err = lease.Grant(l, holder, principal, 15*time.Second, time.Now()); err != nil {
			return nil, err
		}
	}
	if got := len(lease.Queue(l)); got != n {
		return nil, fmt.Errorf("worst lease: %d places of the grammar, want %d", got, n)
	}
	return l, nil
}

// PodUser is the user of a token bound to pod uid of ServiceAccount sa in
// namespace, as the apiserver authenticates it.
func PodUser(namespace, sa, pod, uid string) user.Info {
	return &user.DefaultInfo{
		Name:   "system:serviceaccount:" + namespace + ":" + sa,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
		Extra: map[string][]string{
			lease.PodUIDExtra:                            {uid},
			"authentication.kubernetes.io/pod-name":      {pod},
			"authentication.kubernetes.io/credential-id": {"JTI=00000000-0000-0000-0000-000000000000"},
		},
	}
}

// LongestServiceAccount is the longest ServiceAccount username Kubernetes
// allows (a namespace of 63 characters, a name of 253): 339 characters,
// one short of MaxUsernameLength.
func LongestServiceAccount(i int) (namespace, name string) {
	ns := fmt.Sprintf("worst-ns-%d-", i)
	sa := fmt.Sprintf("worst-sa-%d-", i)
	return ns + strings.Repeat("n", 63-len(ns)), sa + strings.Repeat("s", 253-len(sa))
}
