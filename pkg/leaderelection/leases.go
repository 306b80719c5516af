package leaderelection

import (
	"context"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
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

func (a answeredLeaseInterface) Update(ctx context.Context, l *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	return a.seen(a.LeaseInterface.Update(ctx, l, opts))
}

func (a answeredLeaseInterface) seen(l *coordinationv1.Lease, err error) (*coordinationv1.Lease, error) {
	if err == nil && l != nil {
		a.lock.answered(l.DeepCopy())
	}
	return l, err
}
