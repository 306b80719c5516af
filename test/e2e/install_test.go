//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// TestInstallBundle checks the install as TestMain made it, with
// `kubectl apply --server-side -f dist/install.yaml` into the fresh
// cluster, then dist/install-mutating.yaml where the cluster serves
// MutatingAdmissionPolicy (the kind node image's Kubernetes, 1.37, does):
// every object of the bundles is there, the
// apiserver took up the FlowSchema, and a workload bound to
// frontdesk-lock-user runs a command under a lock with `kubectl dlock run`
// from a pod, with fencing token 1, which the lock's status records.
func TestInstallBundle(t *testing.T) {
	c := start(t, "bundle")
	g := NewWithT(t)

	bundles, err := c.bundles()
	g.Expect(err).NotTo(HaveOccurred())
	for _, b := range bundles {
		c.stepf("every object of %s is in the cluster", b)
		want, got := bundleObjects(t, c.root, b), c.objectsOf(b)
		g.Expect(got).To(ConsistOf(want))
		c.stepf("%d objects", len(got))
	}

	c.stepf("the FlowSchema is in force")
	g.Eventually(func(g Gomega) {
		out, err := c.kubectl("get", "flowschema", "frontdesk-lock-leases", "-o", `jsonpath={.status.conditions[?(@.type=="Dangling")].status}`)
		g.Expect(err).NotTo(HaveOccurred(), out)
		g.Expect(out).To(Equal("False"))
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())

	c.stepf("kubectl dlock run from a pod")
	c.applyFile("bundle-run.yaml")
	c.kubectlOK("-n", c.ns, "wait", "--for=condition=complete", "job/run-under-lock", "--timeout=3m")
	logs := c.kubectlOK("-n", c.ns, "logs", "job/run-under-lock")
	c.stepf("the command printed:\n%s", logs)
	g.Expect(logs).To(MatchRegexp(`(?m)^bundle\s+\S+\s+1\s`), "kubectl dlock get, run under the lock, shows its holder with token 1")
	g.Eventually(func(g Gomega) {
		l, err := c.lock("bundle")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(l.Status.FencingToken).To(BeEquivalentTo(1))
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
}

// bundleObjects lists the objects of a bundle of dist/ as Kind/name.
func bundleObjects(t *testing.T, root, bundle string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, bundle))
	if err != nil {
		t.Fatal(err)
	}
	var objs []string
	for doc := range strings.SplitSeq(string(data), "\n---\n") {
		var obj struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := utilyaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatalf("%s: %v", bundle, err)
		}
		objs = append(objs, obj.Kind+"/"+obj.Metadata.Name)
	}
	return objs
}

// objectsOf lists the objects of a bundle of dist/ that are in the
// cluster, as Kind/name.
func (t *tc) objectsOf(bundle string) []string {
	t.Helper()
	out := t.kubectlOK("get", "-f", filepath.Join(t.root, bundle), "-o", "custom-columns=KIND:.kind,NAME:.metadata.name", "--no-headers")
	var objs []string
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			t.Fatalf("kubectl get -f %s: %q", bundle, line)
		}
		objs = append(objs, f[0]+"/"+f[1])
	}
	return objs
}
