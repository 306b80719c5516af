package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/test/internal/harness"
)

func TestInvalidSpecsAreRejectedWithClearMessages(t *testing.T) {
	ns := newNamespace(t)
	cases := []struct {
		name    string
		spec    map[string]any
		message string
	}{
		{"a name too long for the Lease's label", nil,
			"metadata.name must be at most 63 characters: it is the value of the locks.frontdesk.dev/lock label"},
		{"zero duration", map[string]any{"leaseDurationSeconds": 0}, "spec.leaseDurationSeconds: Invalid value: 0: spec.leaseDurationSeconds in body should be greater than or equal to 1"},
		{"negative duration", map[string]any{"leaseDurationSeconds": -5}, "should be greater than or equal to 1"},
		{"duration over a day", map[string]any{"leaseDurationSeconds": 86401}, "should be less than or equal to 86400"},
		{"duration not a number", map[string]any{"leaseDurationSeconds": "15s"}, `spec.leaseDurationSeconds: Invalid value: "string": spec.leaseDurationSeconds in body must be of type integer`},
		{"lease name with capitals", map[string]any{"leaseName": "Billing_Lease"}, `spec.leaseName: Invalid value: "Billing_Lease": leaseName must be a valid Lease name`},
		{"lease name ending in a dot", map[string]any{"leaseName": "billing."}, "leaseName must be a valid Lease name"},
		{"empty lease name", map[string]any{"leaseName": ""}, "spec.leaseName in body should be at least 1 chars long"},
		{"candidates selector with a bad operator", map[string]any{"candidates": map[string]any{"podSelector": map[string]any{
			"matchExpressions": []any{map[string]any{"key": "app", "operator": "Equals", "values": []any{"web"}}}}}},
			`spec.candidates.podSelector.matchExpressions[0].operator: Unsupported value: "Equals": supported values: "In", "NotIn", "Exists", "DoesNotExist"`},
		{"candidates selector with an invalid label key", map[string]any{"candidates": map[string]any{"podSelector": map[string]any{
			"matchLabels": map[string]any{"bad key!": "x"}}}},
			"podSelector.matchLabels keys must be valid label keys"},
		{"candidates selector with a key prefix in capitals", map[string]any{"candidates": map[string]any{"podSelector": map[string]any{
			"matchLabels": map[string]any{"Example.com/app": "x"}}}},
			"podSelector.matchLabels keys must be valid label keys"},
		{"candidates selector with a value holding a space", map[string]any{"candidates": map[string]any{"podSelector": map[string]any{
			"matchLabels": map[string]any{"app": "web server"}}}},
			`spec.candidates.podSelector.matchLabels.app: Invalid value: "web server": spec.candidates.podSelector.matchLabels.app in body should match`},
		{"candidates selector with a value over 63 characters", map[string]any{"candidates": map[string]any{"podSelector": map[string]any{
			"matchLabels": map[string]any{"app": strings.Repeat("a", 64)}}}},
			"spec.candidates.podSelector.matchLabels.app: Too long: may not be more than 63 bytes"},
		{"candidates selector with an invalid expression key", map[string]any{"candidates": map[string]any{"podSelector": map[string]any{
			"matchExpressions": []any{map[string]any{"key": "-app", "operator": "Exists"}}}}},
			`spec.candidates.podSelector.matchExpressions[0].key: Invalid value: "-app"`},
		{"candidates selector with an invalid expression value", map[string]any{"candidates": map[string]any{"podSelector": map[string]any{
			"matchExpressions": []any{map[string]any{"key": "app", "operator": "In", "values": []any{"web/1"}}}}}},
			`spec.candidates.podSelector.matchExpressions[0].values[0]: Invalid value: "web/1"`},
		{"negative hand-off delay", map[string]any{"candidates": map[string]any{"podSelector": map[string]any{}, "handOffDelaySeconds": -1}},
			"spec.candidates.handOffDelaySeconds in body should be greater than or equal to 0"},
		{"unknown lease adoption", map[string]any{"leaseAdoption": "Always"},
			`spec.leaseAdoption: Unsupported value: "Always": supported values: "WhenFree", "WhileHeld"`},
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
			if tc.spec == nil {
				obj.Object["metadata"] = map[string]any{"name": strings.Repeat("n", 64), "namespace": ns}
				delete(obj.Object, "spec")
			}
			err := k8sClient.Create(context.Background(), obj)
			g := NewWithT(t)
			g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
			g.Expect(err.Error()).To(ContainSubstring(tc.message))
		})
	}
}

// leaseName cannot change by any way of writing the object: a new value,
// clearing it, removing or emptying spec, or a replace without it. Setting it
// to the name it defaults to is not a change.
func TestLeaseNameIsImmutable(t *testing.T) {
	ns := newNamespace(t)
	g := NewWithT(t)
	ctx := context.Background()
	const immutable = "spec.leaseName is immutable (unset, it is the lock's own name): delete the lock and create one with the new leaseName"
	createReadyLock(t, testutil.MakeLock("billing", ns).Obj())
	createReadyLock(t, testutil.MakeLock("named", ns).LeaseName("named-lease").Obj())

	refused := func(what string, err error) {
		t.Helper()
		g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%s: want Invalid, got %v", what, err)
		g.Expect(err.Error()).To(ContainSubstring(immutable), what)
	}
	lock := getLock(g, ns, "billing")
	lock.Spec.LeaseName = "another"
	refused("a new leaseName", k8sClient.Update(ctx, lock))

	named := getLock(g, ns, "named")
	named.Spec.LeaseName = ""
	refused("clearing leaseName", k8sClient.Update(ctx, named))
	refused("removing spec", k8sClient.Patch(ctx, getLock(g, ns, "named"),
		client.RawPatch(types.JSONPatchType, []byte(`[{"op":"remove","path":"/spec"}]`))))
	refused("replacing spec with {}", k8sClient.Patch(ctx, getLock(g, ns, "named"),
		client.RawPatch(types.JSONPatchType, []byte(`[{"op":"replace","path":"/spec","value":{}}]`))))
	replaced := getLock(g, ns, "named")
	replaced.Spec = locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: 20}
	refused("a replace without leaseName", k8sClient.Update(ctx, replaced))

	// Naming the Lease it already uses is not a change; neither is removing
	// spec from a lock whose leaseName was never set.
	lock = getLock(g, ns, "billing")
	lock.Spec.LeaseName = "billing"
	g.Expect(k8sClient.Update(ctx, lock)).To(Succeed(), "setting leaseName to the lock's own name")
	g.Expect(k8sClient.Patch(ctx, getLock(g, ns, "billing"),
		client.RawPatch(types.JSONPatchType, []byte(`[{"op":"replace","path":"/spec","value":{}}]`)))).To(Succeed())

	// Changing the duration is allowed.
	named = getLock(g, ns, "named")
	named.Spec.LeaseDurationSeconds = 30
	g.Expect(k8sClient.Update(ctx, named)).To(Succeed())
	g.Expect(getLock(g, ns, "named").Status.LeaseName).To(Equal("named-lease"))
}

func TestStatusFencingTokenCannotDecrease(t *testing.T) {
	ns := newNamespace(t)
	g := NewWithT(t)
	ctx := context.Background()
	createReadyLock(t, testutil.MakeLock("billing", ns).Obj())
	for range 3 {
		_, err := harness.Grant(ctx, clientset, ns, "billing", "worker-a")
		g.Expect(err).NotTo(HaveOccurred())
	}
	eventually(t, 2*time.Second, func(g Gomega) {
		g.Expect(getLock(g, ns, "billing").Status.FencingToken).To(BeEquivalentTo(3))
	})
	const never = "status.fencingToken must never decrease, and cannot be removed"
	lock := getLock(g, ns, "billing")
	lock.Status.FencingToken = 1
	err := k8sClient.Status().Update(ctx, lock)
	g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
	g.Expect(err.Error()).To(ContainSubstring(never))

	for _, patch := range []string{
		`[{"op":"remove","path":"/status"}]`,
		`[{"op":"remove","path":"/status/fencingToken"}]`,
		`[{"op":"replace","path":"/status","value":{}}]`,
	} {
		err := k8sClient.Status().Patch(ctx, getLock(g, ns, "billing"), client.RawPatch(types.JSONPatchType, []byte(patch)))
		g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%s: want Invalid, got %v", patch, err)
		g.Expect(err.Error()).To(ContainSubstring(never), patch)
	}
	g.Expect(getLock(g, ns, "billing").Status.FencingToken).To(BeEquivalentTo(3))
}
