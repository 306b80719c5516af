//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/frontdesk-dev/frontdesk/internal/cli"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// previousRelease is the commit whose dist/chart, manager and kubectl-dlock
// are the release before this one, which
// TestHelmChartUpgradesFromThePreviousReleaseWithALockHeld upgrades from.
const previousRelease = "b8f62f4"

// crdName is the DistributedLock CRD's.
const crdName = "distributedlocks.locks.frontdesk.dev"

// helm runs bin/helm against the kind cluster.
func (c *kindCluster) helm(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(c.root, "bin", "helm"), append([]string{"--kubeconfig", c.kubeconfig}, args...)...)
	cmd.Dir = c.root
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (t *tc) helmOK(args ...string) string {
	t.Helper()
	out, err := t.helm(args...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// imageValues are the chart values that run image as the manager.
func imageValues(image string) []string {
	repo, tag, _ := strings.Cut(image, ":")
	return []string{"--set", "image.repository=" + repo, "--set", "image.tag=" + tag, "--set", "image.pullPolicy=Never"}
}

// installChart makes the install Helm release frontdesk of dist/chart,
// running this run's manager image, with helm upgrade --install. Where no
// release is installed but the manager is (TestMain applied the bundles),
// the bundles' objects are adopted first, labelled and annotated as
// helm's, as a user moving from the bundles to the chart would.
func (t *tc) installChart(extra ...string) {
	t.Helper()
	_, noRelease := t.helm("status", "frontdesk")
	_, noManager := t.cs.AppsV1().Deployments(managerNS).Get(t.ctx, managerName, metav1.GetOptions{})
	if noRelease != nil && noManager == nil {
		bundles, err := t.bundles()
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range bundles {
			t.kubectlOK("label", "-f", b, "app.kubernetes.io/managed-by=Helm", "--overwrite")
			t.kubectlOK("annotate", "-f", b, "meta.helm.sh/release-name=frontdesk", "meta.helm.sh/release-namespace=default", "--overwrite")
		}
	}
	args := append([]string{"upgrade", "--install", "frontdesk", "dist/chart", "--wait", "--timeout", "4m"}, imageValues(managerImage)...)
	t.helmOK(append(args, extra...)...)
}

// uninstallChart runs helm uninstall and waits until the manager's
// namespace is gone, so that the release can be installed again.
func (t *tc) uninstallChart() {
	t.Helper()
	t.helmOK("uninstall", "frontdesk", "--wait", "--timeout", "4m")
	NewWithT(t.T).Eventually(func(g Gomega) {
		_, err := t.cs.CoreV1().Namespaces().Get(t.ctx, managerNS, metav1.GetOptions{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "namespace %s: %v", managerNS, err)
	}).WithTimeout(3 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
}

// lockClient is a frontdesk client of a lock of the test's namespace, as
// the kind cluster's admin.
func (t *tc) lockClient(name, identity string) *lock.Client {
	t.Helper()
	c, err := lock.New(t.restConfig, lock.Config{Namespace: t.ns, Name: name, Identity: identity})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// lease reads a Lease of the test's namespace.
func (t *tc) lease(name string) (*coordinationv1.Lease, error) {
	return t.cs.CoordinationV1().Leases(t.ns).Get(t.ctx, name, metav1.GetOptions{})
}

// dlockGet runs `kubectl dlock get` in this process and returns what it
// printed on stdout and stderr.
func (t *tc) dlockGet(names ...string) (stdout, stderr string, code int) {
	var out, errOut bytes.Buffer
	args := append([]string{"get", "--kubeconfig", t.kubeconfig, "-n", t.ns}, names...)
	code = cli.Main(args, strings.NewReader(""), &out, &errOut)
	return out.String(), errOut.String(), code
}

// TestHelmChartTakesOverAndUpgradesWithALockHeld makes the install that
// TestMain applied from the bundles of dist/ a Helm release of dist/chart
// (the chart's defaults are the bundles' objects: helm adopts them), then
// upgrades the release to a changed value (the manager's log level),
// which rolls the manager's pods. A grant held across both keeps its
// fencing token and is never lost, and the upgraded manager still records
// grants: the next one has the next token.
func TestHelmChartTakesOverAndUpgradesWithALockHeld(t *testing.T) {
	c := start(t, "chart")
	g := NewWithT(t)
	c.apply(`apiVersion: locks.frontdesk.dev/v1alpha1
kind: DistributedLock
metadata:
  name: across-upgrade
  namespace: NAMESPACE
spec:
  leaseDurationSeconds: 10
`)
	client := c.lockClient("across-upgrade", "e2e-holder")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	var held *lock.Grant
	var err error
	g.Eventually(func() error { held, err = client.TryAcquire(ctx); return err }).
		WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
	c.stepf("holding across-upgrade with fencing token %d", held.Token())

	c.stepf("helm adopts the objects of the bundles as release frontdesk (unless an earlier test made it one)")
	c.installChart()

	c.stepf("helm upgrade to --zap-log-level=debug")
	c.installChart("--set", "logLevel=debug")
	c.kubectlOK("-n", managerNS, "rollout", "status", "deployment/"+managerName, "--timeout=4m")
	dep, err := c.cs.AppsV1().Deployments(managerNS).Get(ctx, managerName, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(dep.Spec.Template.Spec.Containers[0].Args).To(ContainElement("--zap-log-level=debug"))

	g.Expect(held.Err()).NotTo(HaveOccurred(), "the grant held across the upgrade was lost")
	g.Eventually(func(g Gomega) {
		l, err := c.lock("across-upgrade")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(l.Status.Holder).To(Equal("e2e-holder"))
		g.Expect(l.Status.FencingToken).To(Equal(held.Token()))
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
	g.Expect(held.Release(ctx)).To(Succeed())

	next, err := client.TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func(g Gomega) {
		l, err := c.lock("across-upgrade")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(l.Status.FencingToken).To(Equal(held.Token()+1), "the upgraded manager records the next grant")
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
	g.Expect(next.Release(ctx)).To(Succeed())
}

// TestHelmChartUninstallKeepsLocksAndReinstallContinuesTokens uninstalls
// the release while one client holds a lock and another waits in its
// queue: the CRD stays (helm.sh/resource-policy: keep), and so do the
// locks, their Leases and the grant. With no manager, the holder's release
// hands the lock to the waiter, which kubectl dlock get reports as a stale
// status; a lock deleted meanwhile stays Terminating on its finalizer
// until it is removed by hand, as the README says, and its Lease stays as
// the record of its tokens. Installed again, the manager records the
// grant made while it was gone, and every token after continues above
// every token granted before, the deleted lock's too.
func TestHelmChartUninstallKeepsLocksAndReinstallContinuesTokens(t *testing.T) {
	c := start(t, "reinstall")
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	c.installChart()
	c.apply(`apiVersion: locks.frontdesk.dev/v1alpha1
kind: DistributedLock
metadata:
  name: kept
  namespace: NAMESPACE
spec:
  leaseDurationSeconds: 10
---
apiVersion: locks.frontdesk.dev/v1alpha1
kind: DistributedLock
metadata:
  name: stranded
  namespace: NAMESPACE
spec:
  leaseDurationSeconds: 10
`)
	alice, bob := c.lockClient("kept", "e2e-alice"), c.lockClient("kept", "e2e-bob")
	var first *lock.Grant
	var err error
	g.Eventually(func() error { first, err = alice.TryAcquire(ctx); return err }).
		WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
	c.stepf("alice holds kept with fencing token %d", first.Token())
	type result struct {
		grant *lock.Grant
		err   error
	}
	queued := make(chan result, 1)
	go func() { gr, err := bob.Acquire(ctx); queued <- result{gr, err} }()
	g.Eventually(func(g Gomega) {
		l, err := c.lease("kept")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(lease.Queue(l)).To(HaveLen(1), "bob's place in the queue")
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
	c.stepf("bob waits in the queue")
	strandedGrant, err := c.lockClient("stranded", "e2e-carol").TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(strandedGrant.Release(ctx)).To(Succeed())
	c.stepf("stranded granted once, fencing token %d, and released", strandedGrant.Token())

	c.stepf("helm uninstall")
	c.uninstallChart()
	crd := c.kubectlOK("get", "crd", crdName, "-o", `jsonpath={.metadata.annotations.helm\.sh/resource-policy}`)
	g.Expect(crd).To(Equal("keep"), "the CRD stays")
	for _, name := range []string{"kept", "stranded"} {
		l, err := c.lock(name)
		g.Expect(err).NotTo(HaveOccurred(), "lock %s stays", name)
		g.Expect(l.DeletionTimestamp).To(BeNil())
	}
	g.Expect(first.Err()).NotTo(HaveOccurred(), "alice's grant outlives the manager")

	c.stepf("alice releases: bob takes the lock with no manager running")
	g.Expect(first.Release(ctx)).To(Succeed())
	var second *lock.Grant
	select {
	case r := <-queued:
		g.Expect(r.err).NotTo(HaveOccurred())
		second = r.grant
	case <-time.After(time.Minute):
		t.Fatal("bob was not granted the lock within a minute of alice's release")
	}
	g.Expect(second.Token()).To(Equal(first.Token() + 1))
	out, errOut, code := c.dlockGet("kept")
	c.stepf("kubectl dlock get kept:\n%s%s", out, errOut)
	g.Expect(code).To(BeZero())
	g.Expect(out).To(MatchRegexp(`(?m)^kept\s+e2e-bob\s+%d\s.*\sStale\s`, second.Token()))
	g.Expect(errOut).To(ContainSubstring("status stale"))

	c.stepf("stranded deleted with no manager: it stays Terminating on its finalizer")
	c.kubectlOK("-n", c.ns, "delete", "dlock", "stranded", "--wait=false")
	g.Consistently(func(g Gomega) {
		l, err := c.lock("stranded")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(l.DeletionTimestamp).NotTo(BeNil())
	}).WithTimeout(5 * time.Second).WithPolling(time.Second).Should(Succeed())
	c.kubectlOK("-n", c.ns, "patch", "dlock", "stranded", "--type=json", "-p", `[{"op":"remove","path":"/metadata/finalizers"}]`)
	g.Eventually(func() bool {
		_, err := c.lock("stranded")
		return apierrors.IsNotFound(err)
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(BeTrue(), "the lock goes once its finalizer is removed")
	record, err := c.lease("stranded")
	g.Expect(err).NotTo(HaveOccurred(), "the Lease stays as the record of the deleted lock's tokens")
	g.Expect(lease.Token(record)).To(Equal(strandedGrant.Token()))

	c.stepf("helm install again")
	c.installChart()
	g.Eventually(func(g Gomega) {
		l, err := c.lock("kept")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(l.Status.Holder).To(Equal("e2e-bob"))
		g.Expect(l.Status.FencingToken).To(Equal(second.Token()))
	}).WithTimeout(2*time.Minute).WithPolling(time.Second).Should(Succeed(), "the manager records the grant made while it was gone")
	out, errOut, code = c.dlockGet("kept")
	g.Expect(code).To(BeZero())
	g.Expect(out).To(MatchRegexp(`(?m)^kept\s+e2e-bob\s+%d\s.*\sInSync\s`, second.Token()), "%s%s", out, errOut)
	g.Expect(second.Err()).NotTo(HaveOccurred(), "bob's grant outlives the reinstall")
	g.Expect(second.Release(ctx)).To(Succeed())
	third, err := alice.TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(third.Token()).To(Equal(second.Token() + 1))
	g.Expect(third.Release(ctx)).To(Succeed())
	c.stepf("kept: fencing tokens %d, %d (no manager), %d", first.Token(), second.Token(), third.Token())

	c.stepf("stranded created again continues from its record")
	c.apply(`apiVersion: locks.frontdesk.dev/v1alpha1
kind: DistributedLock
metadata:
  name: stranded
  namespace: NAMESPACE
spec:
  leaseDurationSeconds: 10
`)
	var again *lock.Grant
	g.Eventually(func() error { again, err = c.lockClient("stranded", "e2e-carol").TryAcquire(ctx); return err }).
		WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
	g.Expect(again.Token()).To(Equal(strandedGrant.Token() + 1))
	g.Expect(again.Release(ctx)).To(Succeed())
}

// TestHelmChartUpgradesFromThePreviousReleaseWithALockHeld installs the
// previous release (previousRelease: its dist/chart, with its manager
// built from that commit), has a pod hold a lock with that release's
// kubectl dlock run, and upgrades the release to dist/chart and this run's
// manager. The holder keeps its grant and its fencing token across the
// upgrade, every object of this release's bundles is in the cluster
// afterwards, and the next grant, made with this release's client once the
// old holder ended, carries the next token.
func TestHelmChartUpgradesFromThePreviousReleaseWithALockHeld(t *testing.T) {
	c := start(t, "previous")
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	c.stepf("building the manager and kubectl-dlock images of %s", previousRelease)
	oldManager, oldPlugin := "frontdesk-controller:"+previousRelease, "frontdesk-kubectl-dlock:"+previousRelease
	g.Expect(runScript(c.root, "hack/kind/build-images.sh", []string{"SOURCE_REF=" + previousRelease}, oldManager, oldPlugin)).To(Succeed())
	g.Expect(loadImages(oldManager, oldPlugin)).To(Succeed())
	oldChart := filepath.Join(t.TempDir(), "chart")
	g.Expect(extractChart(c.root, previousRelease, oldChart)).To(Succeed())

	c.stepf("the cluster goes back to the release of %s (the CRD stays)", previousRelease)
	c.installChart()
	c.uninstallChart()
	c.helmOK(append([]string{"install", "frontdesk", oldChart, "--wait", "--timeout", "4m"}, imageValues(oldManager)...)...)
	dep, err := c.cs.AppsV1().Deployments(managerNS).Get(ctx, managerName, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(dep.Spec.Template.Spec.Containers[0].Image).To(Equal(oldManager))

	c.stepf("a pod holds the lock with kubectl dlock run of %s", previousRelease)
	c.applyFile("previous-release-holder.yaml", "PREVIOUS_PLUGIN_IMAGE", oldPlugin)
	var holder string
	var token int64
	g.Eventually(func(g Gomega) {
		l, err := c.lock("across-releases")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(l.Status.Holder).NotTo(BeEmpty())
		holder, token = l.Status.Holder, l.Status.FencingToken
	}).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
	c.stepf("%s holds across-releases with fencing token %d", holder, token)

	c.stepf("helm upgrade to dist/chart and this run's manager")
	c.helmOK(append([]string{"upgrade", "frontdesk", "dist/chart", "--wait", "--timeout", "4m"}, imageValues(managerImage)...)...)
	c.kubectlOK("-n", managerNS, "rollout", "status", "deployment/"+managerName, "--timeout=4m")
	dep, err = c.cs.AppsV1().Deployments(managerNS).Get(ctx, managerName, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(dep.Spec.Template.Spec.Containers[0].Image).To(Equal(managerImage))
	bundles, err := c.bundles()
	g.Expect(err).NotTo(HaveOccurred())
	for _, b := range bundles {
		g.Expect(c.objectsOf(b)).To(ConsistOf(bundleObjects(t, c.root, b)), "every object of %s after the upgrade", b)
	}
	g.Expect(c.kubectlOK("get", "crd", crdName, "-o", `jsonpath={.metadata.annotations.helm\.sh/resource-policy}`)).To(Equal("keep"))

	c.stepf("the holder keeps its grant for three lease durations under this release's manager and policies")
	g.Consistently(func(g Gomega) {
		l, err := c.lock("across-releases")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(l.Status.Holder).To(Equal(holder))
		g.Expect(l.Status.FencingToken).To(Equal(token))
		pod, err := c.cs.CoreV1().Pods(c.ns).Get(ctx, "holder", metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(pod.Status.Phase).To(Equal(corev1.PodRunning))
	}).WithTimeout(30 * time.Second).WithPolling(2 * time.Second).Should(Succeed())

	c.stepf("the holder ends (its pod deleted: kubectl dlock run releases); this release's client takes the lock")
	c.kubectlOK("-n", c.ns, "delete", "pod", "holder", "--timeout=2m")
	waitCtx, waitCancel := context.WithTimeout(ctx, 2*time.Minute)
	defer waitCancel()
	next, err := c.lockClient("across-releases", "e2e-next").Acquire(waitCtx)
	g.Expect(err).NotTo(HaveOccurred())
	c.stepf("next grant: fencing token %d", next.Token())
	g.Expect(next.Token()).To(Equal(token+1), "no token repeats, none is skipped")
	g.Expect(next.Release(ctx)).To(Succeed())
}

// extractChart writes the dist/chart of a commit of the repository into dir.
func extractChart(root, commit, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	archive := exec.Command("git", "-C", root, "archive", commit, "dist/chart")
	tar := exec.Command("tar", "-x", "--strip-components=2", "-C", dir)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return err
	}
	tar.Stdin = pipe
	var stderr bytes.Buffer
	archive.Stderr, tar.Stderr = &stderr, &stderr
	if err := tar.Start(); err != nil {
		return err
	}
	if err := archive.Run(); err != nil {
		return errors.Join(fmt.Errorf("git archive %s dist/chart: %w: %s", commit, err, stderr.String()), tar.Wait())
	}
	if err := tar.Wait(); err != nil {
		return fmt.Errorf("extracting the chart of %s: %w: %s", commit, err, stderr.String())
	}
	return nil
}
