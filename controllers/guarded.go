package controllers

import (
	"context"
	"fmt"
	"slices"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

// Whether the apiserver guards a lock's Lease is the cluster's, not the
// lock's: the lease-guard ValidatingAdmissionPolicy (config/lease-policy)
// must be installed, and a binding of it that denies must apply to the
// lock's namespace. Without it, honest clients behave the same, but nothing
// keeps a participant from ending another's grant. The controller says so
// on every lock (condition Guarded), from the policies and bindings it
// watches (labelled locks.frontdesk.dev/policy=lease-guard, whatever their
// names), and looks again whenever one of them changes.

// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingadmissionpolicies;validatingadmissionpolicybindings,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=list;watch

// leaseGuardIn reports whether the lease guard applies to namespace, and if
// not, what is missing.
func (r *DistributedLockReconciler) leaseGuardIn(ctx context.Context, namespace string) (bool, string, error) {
	selector := client.MatchingLabels{locksv1alpha1.PolicyLabel: locksv1alpha1.PolicyLabelLeaseGuard}
	var policies admissionregistrationv1.ValidatingAdmissionPolicyList
	if err := r.List(ctx, &policies, selector); err != nil {
		return false, "", fmt.Errorf("listing the lease-guard policies: %w", err)
	}
	if len(policies.Items) == 0 {
		return false, "the lease-guard ValidatingAdmissionPolicy (config/lease-policy, labelled " + locksv1alpha1.PolicyLabel + "=" +
			locksv1alpha1.PolicyLabelLeaseGuard + ") is not installed: nothing keeps participants from ending each other's grants; " +
			"install dist/install.yaml (or config/default)", nil
	}
	var bindings admissionregistrationv1.ValidatingAdmissionPolicyBindingList
	if err := r.List(ctx, &bindings, selector); err != nil {
		return false, "", fmt.Errorf("listing the lease-guard bindings: %w", err)
	}
	ns := &corev1.Namespace{}
	if err := r.Get(ctx, types.NamespacedName{Name: namespace}, ns); err != nil {
		return false, "", fmt.Errorf("reading namespace %s: %w", namespace, err)
	}
	for i := range bindings.Items {
		if bindsGuard(&bindings.Items[i], policies.Items, ns) {
			return true, "", nil
		}
	}
	return false, fmt.Sprintf("the lease-guard policy is installed, but no binding of it with validationActions Deny applies to namespace %s: "+
		"nothing keeps participants from ending each other's grants here", namespace), nil
}

// bindsGuard reports whether b binds one of the lease-guard policies, with
// Deny, to namespace ns.
func bindsGuard(b *admissionregistrationv1.ValidatingAdmissionPolicyBinding, policies []admissionregistrationv1.ValidatingAdmissionPolicy,
	ns *corev1.Namespace) bool {
	if !slices.ContainsFunc(policies, func(p admissionregistrationv1.ValidatingAdmissionPolicy) bool { return p.Name == b.Spec.PolicyName }) ||
		!slices.Contains(b.Spec.ValidationActions, admissionregistrationv1.Deny) {
		return false
	}
	if b.Spec.MatchResources == nil || b.Spec.MatchResources.NamespaceSelector == nil {
		return true
	}
	sel, err := metav1.LabelSelectorAsSelector(b.Spec.MatchResources.NamespaceSelector)
	return err == nil && sel.Matches(labels.Set(ns.Labels))
}

// setGuarded sets the Guarded condition.
func setGuarded(st *locksv1alpha1.DistributedLockStatus, generation int64, guarded bool, why string) {
	c := metav1.Condition{Type: locksv1alpha1.ConditionGuarded, Status: metav1.ConditionTrue, Reason: locksv1alpha1.ReasonLeaseGuarded,
		Message: "the lease-guard policy applies to this lock's Lease", ObservedGeneration: generation}
	if !guarded {
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, locksv1alpha1.ReasonLeaseGuardMissing, why
	}
	meta.SetStatusCondition(&st.Conditions, c)
}

// allLocks enqueues every lock: a policy or binding of the lease guard
// changed, and with it every lock's Guarded condition may have.
func (r *DistributedLockReconciler) allLocks() handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		var locks locksv1alpha1.DistributedLockList
		if err := r.List(ctx, &locks); err != nil {
			return nil
		}
		out := make([]reconcile.Request, 0, len(locks.Items))
		for i := range locks.Items {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&locks.Items[i])})
		}
		return out
	})
}
