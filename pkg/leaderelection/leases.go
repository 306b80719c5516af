package leaderelection

import (
	"context"
	"maps"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

// answeredLeases is the client the wrapped resourcelock.LeaseLock uses: it
// passes every call through and shows the Lock the Lease the apiserver
// answered Get, Create and Update with, so the token comes from the stored
// object, not from the record client-go meant to write.
type answeredLeases struct {
	coordinationclient.LeasesGetter
	lock *Lock
}

func (a answeredLeases) Leases(namespace string) coordinationclient.LeaseInterface {
	return answeredLeaseInterface{LeaseInterface: a.LeasesGetter.Leases(namespace), lock: a.lock}
}

type answeredLeaseInterface struct {
	coordinationclient.LeaseInterface
	lock *Lock
}

func (a answeredLeaseInterface) Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error) {
	return a.seen(a.LeaseInterface.Get(ctx, name, opts))
}

func (a answeredLeaseInterface) Create(ctx context.Context, l *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error) {
	return a.seen(a.LeaseInterface.Create(ctx, l, opts))
}

// Update binds a record naming this process to its principal (see
// lock.Principal: the lease-guard policy refuses a grant bound to any
// other, or to none), sets Config.Labels, and passes it on.
func (a answeredLeaseInterface) Update(ctx context.Context, l *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	if ptr.Deref(l.Spec.HolderIdentity, "") == a.lock.cfg.Identity {
		principal, err := a.lock.principal(ctx)
		if err != nil {
			return nil, err
		}
		l = l.DeepCopy()
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		l.Annotations[locksv1alpha1.HolderPrincipalAnnotation] = principal
	}
	return a.seen(a.LeaseInterface.Update(ctx, withLabels(l, a.lock.cfg.Labels), opts))
}

// withLabels is l with labels set over its own, the others kept, as
// resourcelock.LeaseLock's Labels does on an update. It is done here, not by
// LeaseLock, because LeaseLock has Labels only from client-go v0.34 on and
// the library supports v0.33.
func withLabels(l *coordinationv1.Lease, labels map[string]string) *coordinationv1.Lease {
	if len(labels) == 0 {
		return l
	}
	l = l.DeepCopy()
	if l.Labels == nil {
		l.Labels = make(map[string]string, len(labels))
	}
	maps.Copy(l.Labels, labels)
	return l
}

func (a answeredLeaseInterface) seen(l *coordinationv1.Lease, err error) (*coordinationv1.Lease, error) {
	if err == nil && l != nil {
		a.lock.answered(l.DeepCopy())
	}
	return l, err
}
