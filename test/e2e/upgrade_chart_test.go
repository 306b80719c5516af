//go:build e2e

package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// helm runs bin/helm against the kind cluster.
func (c *kindCluster) helm(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(c.root, "bin", "helm"), append([]string{"--kubeconfig", c.kubeconfig}, args...)...)
	cmd.Dir = c.root
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestHelmChartTakesOverAndUpgradesWithALockHeld makes the install that
// TestMain applied from dist/install.yaml a Helm release of dist/chart
// (the chart's defaults are the bundle's objects: helm adopts them), then
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
	client, err := lock.New(c.restConfig, lock.Config{Namespace: c.ns, Name: "across-upgrade", Identity: "e2e-holder"})
	g.Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	var held *lock.Grant
	g.Eventually(func() error { held, err = client.TryAcquire(ctx); return err }).
		WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
	c.stepf("holding across-upgrade with fencing token %d", held.Token())

	c.stepf("helm adopts the objects of dist/install.yaml as release frontdesk")
	bundle := filepath.Join(c.root, "dist", "install.yaml")
	c.kubectlOK("label", "-f", bundle, "app.kubernetes.io/managed-by=Helm", "--overwrite")
	c.kubectlOK("annotate", "-f", bundle, "meta.helm.sh/release-name=frontdesk", "meta.helm.sh/release-namespace=default", "--overwrite")
	image := strings.SplitN(managerImage, ":", 2)
	values := []string{"--set", "image.repository=" + image[0], "--set", "image.tag=" + image[1], "--set", "image.pullPolicy=Never"}
	out, err := c.helm(append([]string{"upgrade", "--install", "frontdesk", "dist/chart", "--wait", "--timeout", "4m"}, values...)...)
	g.Expect(err).NotTo(HaveOccurred(), out)

	c.stepf("helm upgrade to --zap-log-level=debug")
	out, err = c.helm(append([]string{"upgrade", "frontdesk", "dist/chart", "--wait", "--timeout", "4m", "--set", "logLevel=debug"}, values...)...)
	g.Expect(err).NotTo(HaveOccurred(), out)
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
