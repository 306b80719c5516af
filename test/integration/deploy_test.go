package integration

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/frontdesk-dev/frontdesk/internal/controlplane"
	"github.com/frontdesk-dev/frontdesk/internal/manager"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

const managerSA = "system:serviceaccount:frontdesk-system:frontdesk-controller-manager"

var (
	deployOnce   sync.Once
	deployOutput string
	deployErr    error
)

// kubectl runs the kubectl of the suite's control-plane binaries (built with
// its kube-apiserver by hack/build-k8s-binaries.sh) against the test
// apiserver, from the repository root.
func kubectl(args ...string) (string, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command(filepath.Join(assetsDir, "kubectl"), append([]string{"--kubeconfig", kubeconfigPath}, args...)...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// leaseGuardNamespaceLabel scopes the Lease guard policy in this suite to
// the namespaces labelled with it: other tests play hand-editors (winding a
// Lease back, forging holders) that the guard would stop before the
// controller's own defences could be seen at work.
const leaseGuardNamespaceLabel = "test.frontdesk.dev/lease-guard"

// leaseGuardPolicies are the admission policies of config/lease-policy, as
// config/default names them, and those of config/mutating (the admission
// gate, the principal of stock client-go electors' grants), which the suite
// applies too where the apiserver serves MutatingAdmissionPolicy; the suite
// scopes their bindings to namespaces labelled leaseGuardNamespaceLabel
// (other tests create pods that name a lock without the admission gate).
var leaseGuardPolicies = []string{"frontdesk-lease-guard", "frontdesk-lease-token-guard", "frontdesk-lease-delete-guard", "frontdesk-lease-create-guard"}

// mutatingPolicies are config/mutating's.
var mutatingPolicies = []string{"frontdesk-admission-gate", "frontdesk-lease-principal"}

// kubectlWithInput runs kubectl with input on its standard input.
func kubectlWithInput(input string, args ...string) (string, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command(filepath.Join(assetsDir, "kubectl"), append([]string{"--kubeconfig", kubeconfigPath}, args...)...)
	cmd.Dir = root
	cmd.Stdin = strings.NewReader(input)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// deployDefault applies config/default as a user would, and config/mutating
// where the apiserver serves MutatingAdmissionPolicy, except that the
// bindings of their policies are scoped to namespaces labelled
// leaseGuardNamespaceLabel.
func deployDefault(t *testing.T) string {
	t.Helper()
	deployOnce.Do(func() {
		deployOutput, deployErr = applyScoped("config/default", leaseGuardPolicies)
		if deployErr != nil || !servesMutatingPolicies() {
			return
		}
		var out string
		out, deployErr = applyScoped("config/mutating", mutatingPolicies)
		deployOutput += out
	})
	if deployErr != nil {
		t.Fatalf("kubectl apply --server-side -k config/default: %v\n%s", deployErr, deployOutput)
	}
	return deployOutput
}

// applyScoped applies the kustomization dir with the bindings of policies
// scoped to namespaces labelled leaseGuardNamespaceLabel.
func applyScoped(dir string, policies []string) (string, error) {
	built, err := kubectl("kustomize", dir)
	if err != nil {
		return built, err
	}
	scoped := built
	for _, policy := range policies {
		line := "  policyName: " + policy + "\n"
		if !strings.Contains(scoped, line) {
			return "", fmt.Errorf("the %s binding was not found in %s", policy, dir)
		}
		scoped = strings.Replace(scoped, line, line+"  matchResources:\n    namespaceSelector:\n      matchLabels:\n        "+
			leaseGuardNamespaceLabel+": \"on\"\n", 1)
	}
	return kubectlWithInput(scoped, "apply", "--server-side", "--force-conflicts", "-f", "-")
}

// guardAloneNamespaceLabel selects the namespaces that a second binding
// of each of config/default's Lease policies applies to, and no mutating
// policy: there the validating guard alone decides, as on clusters
// without config/mutating (which rewrites the principal of a grant where
// the guard would refuse it).
const guardAloneNamespaceLabel = "test.frontdesk.dev/lease-guard-alone"

var (
	guardAloneOnce sync.Once
	guardAloneErr  error
)

// guardAloneNamespace is a namespace the Lease policies of config/default
// guard, without config/mutating's.
func guardAloneNamespace(t *testing.T) string {
	t.Helper()
	deployDefault(t)
	guardAloneOnce.Do(func() { guardAloneErr = bindGuardAlone() })
	if guardAloneErr != nil {
		t.Fatalf("binding the Lease policies to namespaces labelled %s: %v", guardAloneNamespaceLabel, guardAloneErr)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "guarded-alone-", Labels: map[string]string{guardAloneNamespaceLabel: "on"}}}
	if err := k8sClient.Create(context.Background(), ns); err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	return ns.Name
}

// bindGuardAlone applies a second binding of each Lease policy of
// config/default (named <binding>-alone), scoped to namespaces labelled
// guardAloneNamespaceLabel.
func bindGuardAlone() error {
	built, err := kubectl("kustomize", "config/default")
	if err != nil {
		return fmt.Errorf("%w: %s", err, built)
	}
	var bindings []string
	for doc := range strings.SplitSeq(built, "\n---\n") {
		if !strings.Contains(doc, "kind: ValidatingAdmissionPolicyBinding\n") {
			continue
		}
		for _, policy := range leaseGuardPolicies {
			line := "  policyName: " + policy + "\n"
			if !strings.Contains(doc, line) {
				continue
			}
			doc = strings.Replace(doc, "  name: "+policy+"\n", "  name: "+policy+"-alone\n", 1)
			bindings = append(bindings, strings.Replace(doc, line, line+"  matchResources:\n    namespaceSelector:\n      matchLabels:\n        "+
				guardAloneNamespaceLabel+": \"on\"\n", 1))
		}
	}
	if len(bindings) != len(leaseGuardPolicies) {
		return fmt.Errorf("found %d of the %d bindings of %v in config/default", len(bindings), len(leaseGuardPolicies), leaseGuardPolicies)
	}
	out, err := kubectlWithInput(strings.Join(bindings, "\n---\n"), "apply", "--server-side", "--force-conflicts", "-f", "-")
	if err != nil {
		return fmt.Errorf("%w: %s", err, out)
	}
	return nil
}

// servesMutatingPolicies reports whether the apiserver serves
// admissionregistration.k8s.io/v1 MutatingAdmissionPolicy.
func servesMutatingPolicies() bool {
	resources, err := clientset.Discovery().ServerResourcesForGroupVersion("admissionregistration.k8s.io/v1")
	if err != nil {
		return false
	}
	return slices.ContainsFunc(resources.APIResources, func(r metav1.APIResource) bool { return r.Kind == "MutatingAdmissionPolicy" })
}

func TestConfigDefaultIsAccepted(t *testing.T) {
	out := deployDefault(t)
	g := NewWithT(t)
	for _, want := range []string{
		"namespace/frontdesk-system serverside-applied",
		"customresourcedefinition.apiextensions.k8s.io/distributedlocks.locks.frontdesk.dev serverside-applied",
		"serviceaccount/frontdesk-controller-manager serverside-applied",
		"role.rbac.authorization.k8s.io/frontdesk-leader-election-role serverside-applied",
		"clusterrole.rbac.authorization.k8s.io/frontdesk-manager-role serverside-applied",
		"clusterrole.rbac.authorization.k8s.io/frontdesk-lock-user serverside-applied",
		"clusterrole.rbac.authorization.k8s.io/frontdesk-metrics-reader serverside-applied",
		"clusterrolebinding.rbac.authorization.k8s.io/frontdesk-manager-rolebinding serverside-applied",
		"service/frontdesk-controller-manager-metrics serverside-applied",
		"deployment.apps/frontdesk-controller-manager serverside-applied",
		"validatingadmissionpolicy.admissionregistration.k8s.io/frontdesk-lease-guard serverside-applied",
		"validatingadmissionpolicybinding.admissionregistration.k8s.io/frontdesk-lease-guard serverside-applied",
	} {
		g.Expect(out).To(ContainSubstring(want))
	}
	// The Deployment is as the issue asks: 2 replicas, leader election,
	// non-root, read-only root filesystem, limits and probes.
	dep, err := clientset.AppsV1().Deployments("frontdesk-system").Get(context.Background(), "frontdesk-controller-manager", metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ptr.Deref(dep.Spec.Replicas, 0)).To(BeEquivalentTo(2))
	c := dep.Spec.Template.Spec.Containers[0]
	g.Expect(c.Args).To(ContainElement("--leader-elect"))
	g.Expect(ptr.Deref(dep.Spec.Template.Spec.SecurityContext.RunAsNonRoot, false)).To(BeTrue())
	g.Expect(ptr.Deref(c.SecurityContext.ReadOnlyRootFilesystem, false)).To(BeTrue())
	g.Expect(ptr.Deref(c.SecurityContext.AllowPrivilegeEscalation, true)).To(BeFalse())
	g.Expect(c.Resources.Limits).NotTo(BeEmpty())
	g.Expect(c.Resources.Requests).NotTo(BeEmpty())
	g.Expect(c.LivenessProbe).NotTo(BeNil())
	g.Expect(c.ReadinessProbe).NotTo(BeNil())
}

// TestInstallBundlesApply applies the install bundles of dist/ as the
// README says, server-side, as a dry run (the apiserver validates and
// admits every object, and the suite's own install, with its scoped
// bindings, stays): install.yaml on every Kubernetes the suite runs
// against, install-mutating.yaml where the apiserver serves
// MutatingAdmissionPolicy. Where it does not (1.33), the mutating bundle
// is refused for want of its kind, which is why it is a bundle of its own.
func TestInstallBundlesApply(t *testing.T) {
	deployDefault(t) // the namespace exists: a dry run creates nothing
	g := NewWithT(t)
	out, err := kubectl("apply", "--server-side", "--dry-run=server", "-f", "dist/install.yaml")
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(out).To(ContainSubstring("deployment.apps/frontdesk-controller-manager serverside-applied (server dry run)"))
	g.Expect(out).To(ContainSubstring("validatingadmissionpolicy.admissionregistration.k8s.io/frontdesk-lease-guard serverside-applied (server dry run)"))
	out, err = kubectl("apply", "--server-side", "--dry-run=server", "-f", "dist/install-mutating.yaml")
	if servesMutatingPolicies() {
		g.Expect(err).NotTo(HaveOccurred(), out)
		g.Expect(out).To(ContainSubstring("mutatingadmissionpolicy.admissionregistration.k8s.io/frontdesk-admission-gate serverside-applied (server dry run)"))
		return
	}
	g.Expect(err).To(HaveOccurred(), out)
	g.Expect(out).To(ContainSubstring(`no matches for kind "MutatingAdmissionPolicy"`))
}

// The manager's ServiceAccount can do what the controller needs, and no more.
func TestManagerRBACIsLeastPrivilege(t *testing.T) {
	deployDefault(t)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"get", "distributedlocks.locks.frontdesk.dev", "-A"}, "yes"},
		{[]string{"watch", "distributedlocks.locks.frontdesk.dev", "-A"}, "yes"},
		{[]string{"update", "distributedlocks.locks.frontdesk.dev/status", "-n", "default"}, "yes"},
		{[]string{"update", "distributedlocks.locks.frontdesk.dev/finalizers", "-n", "default"}, "yes"},
		{[]string{"create", "leases.coordination.k8s.io", "-n", "default"}, "yes"},
		{[]string{"update", "leases.coordination.k8s.io", "-n", "default"}, "yes"},
		{[]string{"delete", "leases.coordination.k8s.io", "-n", "default"}, "no"}, // a deleted lock keeps its Lease as the token record
		{[]string{"patch", "pods", "-n", "default"}, "yes"},
		{[]string{"update", "pods", "-n", "default"}, "yes"}, // an admitted pod's gate and token, in one write
		{[]string{"watch", "pods", "-A"}, "yes"},
		{[]string{"create", "events.events.k8s.io", "-n", "default"}, "yes"},
		{[]string{"create", "tokenreviews.authentication.k8s.io"}, "yes"},
		{[]string{"create", "subjectaccessreviews.authorization.k8s.io"}, "yes"},
		{[]string{"patch", "leases.coordination.k8s.io", "-n", "frontdesk-system"}, "yes"}, // its own leader election

		{[]string{"create", "distributedlocks.locks.frontdesk.dev", "-n", "default"}, "no"},
		{[]string{"delete", "distributedlocks.locks.frontdesk.dev", "-n", "default"}, "no"},
		{[]string{"patch", "leases.coordination.k8s.io", "-n", "default"}, "yes"}, // the lapse mark, the passed places
		{[]string{"create", "pods", "-n", "default"}, "no"},
		{[]string{"delete", "pods", "-n", "default"}, "yes"}, // an admitted pod that did not start (spec.podStartTimeoutSeconds)
		{[]string{"update", "pods", "--subresource=status", "-n", "default"}, "no"},
		{[]string{"get", "secrets", "-n", "default"}, "no"},
		{[]string{"list", "configmaps", "-n", "default"}, "no"},
		{[]string{"create", "deployments.apps", "-n", "default"}, "no"},
		{[]string{"escalate", "clusterroles.rbac.authorization.k8s.io"}, "no"},
	}
	for _, tc := range cases {
		args := append([]string{"auth", "can-i"}, tc.args...)
		out, _ := kubectl(append(args, "--as", managerSA)...) // can-i exits 1 for "no"
		lines := strings.Split(strings.TrimSpace(out), "\n")  // warnings may come first
		if got := lines[len(lines)-1]; got != tc.want {
			t.Errorf("can-i %s as the manager: %q, want %q", strings.Join(tc.args, " "), got, tc.want)
		}
	}
}

// A workload bound to frontdesk-lock-user can acquire, renew and release,
// and cannot forge status or delete or create Leases.
func TestLockUserRoleIsEnoughAndNoMore(t *testing.T) {
	deployDefault(t)
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(3).Obj())
	ctx := context.Background()
	g := NewWithT(t)
	g.Expect(k8sClient.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "alice-locks", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "frontdesk-lock-user"},
		Subjects:   []rbacv1.Subject{{Kind: "User", Name: "alice"}},
	})).To(Succeed())
	alice := rest.CopyConfig(cfg)
	alice.Impersonate = rest.ImpersonationConfig{UserName: "alice"}

	var c *lock.Client
	var grant *lock.Grant
	eventually(t, 5*time.Second, func(g Gomega) { // RBAC caches catch up with the new binding
		var err error
		c, err = lock.New(alice, lock.Config{Namespace: ns, Name: "billing", Identity: "alice-1", RenewInterval: 300 * time.Millisecond})
		g.Expect(err).NotTo(HaveOccurred())
		grant, err = c.TryAcquire(ctx)
		g.Expect(err).NotTo(HaveOccurred())
	})
	first := getLease(g, ns, "billing").Spec.RenewTime
	eventually(t, 3*time.Second, func(g Gomega) {
		g.Expect(getLease(g, ns, "billing").Spec.RenewTime.Time.After(first.Time)).To(BeTrue(), "alice's renewals land")
	})
	g.Expect(grant.Lost()).NotTo(BeClosed())
	g.Expect(grant.Release(ctx)).To(Succeed())
	g.Expect(getLease(g, ns, "billing").Spec.HolderIdentity).To(BeNil())

	ac, err := client.New(alice, client.Options{Scheme: manager.NewScheme()})
	g.Expect(err).NotTo(HaveOccurred())
	forged := getLock(g, ns, "billing")
	forged.Status.FencingToken = 999
	g.Expect(apierrors.IsForbidden(ac.Status().Update(ctx, forged))).To(BeTrue(), "alice must not write lock status")
	acs, err := kubernetes.NewForConfig(alice)
	g.Expect(err).NotTo(HaveOccurred())
	err = acs.CoordinationV1().Leases(ns).Delete(ctx, "billing", metav1.DeleteOptions{})
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "alice must not delete Leases: %v", err)
	_, err = acs.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "forged"}}, metav1.CreateOptions{})
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "alice must not create Leases: %v", err)
	_, err = acs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "alice must not list the namespace's events: %v", err)
}

// frontdesk-lock-admin writes nothing by itself: bound cluster-wide (what
// its docs advise against), it grants no update of a Lease anywhere, the
// nodes' heartbeats in kube-node-lease and kube-system's leader elections
// included; it adds the verbs break and prioritize, and the events.
func TestLockAdminRoleBoundClusterWideWritesNoLease(t *testing.T) {
	deployDefault(t)
	ctx := context.Background()
	g := NewWithT(t)
	g.Expect(k8sClient.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "oncall-everywhere"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "frontdesk-lock-admin"},
		Subjects:   []rbacv1.Subject{{Kind: "User", Name: "oncall-everywhere"}},
	})).To(Succeed())
	oncall := rest.CopyConfig(cfg)
	oncall.Impersonate = rest.ImpersonationConfig{UserName: "oncall-everywhere"}
	eventually(t, 5*time.Second, func(g Gomega) { // RBAC caches catch up with the new binding
		can, err := canI(ctx, oncall, "kube-system", "break", "distributedlocks.locks.frontdesk.dev")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(can).To(BeTrue())
	})
	for _, ns := range []string{"kube-node-lease", "kube-system", "default"} {
		for _, verb := range []string{"update", "patch", "delete", "create"} {
			can, err := canI(ctx, oncall, ns, verb, "leases.coordination.k8s.io")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(can).To(BeFalse(), "a cluster-wide lock-admin may %s leases in %s", verb, ns)
		}
		can, err := canI(ctx, oncall, ns, "prioritize", "distributedlocks.locks.frontdesk.dev")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(can).To(BeTrue())
	}
}
