package integration

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	testutil "github.com/frontdesk-dev/frontdesk/test/util"
)

func TestInvalidSpecsAreRejectedWithClearMessages(t *testing.T) {
	ns := newNamespace(t)
	cases := []struct {
		name    string
		spec    map[string]any
		message string
	}{
		{"zero duration", map[string]any{"leaseDurationSeconds": 0}, "spec.leaseDurationSeconds: Invalid value: 0: spec.leaseDurationSeconds in body should be greater than or equal to 1"},
		{"negative duration", map[string]any{"leaseDurationSeconds": -5}, "should be greater than or equal to 1"},
		{"duration over a day", map[string]any{"leaseDurationSeconds": 86401}, "should be less than or equal to 86400"},
		{"duration not a number", map[string]any{"leaseDurationSeconds": "15s"}, `spec.leaseDurationSeconds: Invalid value: "string": spec.leaseDurationSeconds in body must be of type integer`},
		{"lease name with capitals", map[string]any{"leaseName": "Billing_Lease"}, `spec.leaseName: Invalid value: "Billing_Lease": leaseName must be a valid Lease name`},
		{"lease name ending in a dot", map[string]any{"leaseName": "billing."}, "leaseName must be a valid Lease name"},
		{"empty lease name", map[string]any{"leaseName": ""}, "spec.leaseName in body should be at least 1 chars long"},
		{"candidates selector with a bad operator", map[string]any{"candidates": map[string]any{"podSelector": map[string]any{
			"matchExpressions": []any{map[string]any{"key": "app", "operator": "Equals", "values": []any{"web"}}}}}},
			"podSelector.matchExpressions[].operator must be one of In, NotIn, Exists, DoesNotExist"},
		{"candidates selector In without values", map[string]any{"candidates": map[string]any{"podSelector": map[string]any{
			"matchExpressions": []any{map[string]any{"key": "app", "operator": "In"}}}}},
			"In and NotIn need values; Exists and DoesNotExist take none"},
		{"candidates without a selector", map[string]any{"candidates": map[string]any{}}, "spec.candidates.podSelector: Required value"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			obj := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "locks.frontdesk.dev/v1alpha1",
				"kind":       "DistributedLock",
				"metadata":   map[string]any{"generateName": "bad-", "namespace": ns},
				"spec":       tc.spec,
			}}
			err := k8sClient.Create(context.Background(), obj)
			g := NewWithT(t)
			g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
			g.Expect(err.Error()).To(ContainSubstring(tc.message))
		})
	}
}

func TestLeaseNameIsImmutable(t *testing.T) {
	ns := newNamespace(t)
	g := NewWithT(t)
	ctx := context.Background()
	lock := createReadyLock(t, testutil.MakeLock("billing", ns).Obj())

	lock.Spec.LeaseName = "another"
	err := k8sClient.Update(ctx, lock)
	g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
	g.Expect(err.Error()).To(ContainSubstring("leaseName is immutable: delete and recreate the lock to use another Lease"))

	named := createReadyLock(t, testutil.MakeLock("named", ns).LeaseName("named-lease").Obj())
	named.Spec.LeaseName = ""
	err = k8sClient.Update(ctx, named)
	g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "clearing leaseName: want Invalid, got %v", err)
	g.Expect(err.Error()).To(ContainSubstring("leaseName is immutable"))

	// Changing the duration is allowed.
	named = getLock(g, ns, "named")
	named.Spec.LeaseDurationSeconds = 30
	g.Expect(k8sClient.Update(ctx, named)).To(Succeed())
}

func TestStatusFencingTokenCannotDecrease(t *testing.T) {
	ns := newNamespace(t)
	g := NewWithT(t)
	ctx := context.Background()
	createReadyLock(t, testutil.MakeLock("billing", ns).Obj())
	for range 3 {
		_, err := testutil.Grant(ctx, clientset, ns, "billing", "worker-a")
		g.Expect(err).NotTo(HaveOccurred())
	}
	eventually(t, 2*time.Second, func(g Gomega) {
		g.Expect(getLock(g, ns, "billing").Status.FencingToken).To(BeEquivalentTo(3))
	})
	lock := getLock(g, ns, "billing")
	lock.Status.FencingToken = 1
	err := k8sClient.Status().Update(ctx, lock)
	g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
	g.Expect(err.Error()).To(ContainSubstring("fencingToken must never decrease"))
}
