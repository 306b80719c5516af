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
// cluster: every object of the bundle is there, the apiserver took up its
// FlowSchema, and a workload bound to frontdesk-lock-user runs a command
// under a lock with `kubectl dlock run` from a pod, with fencing token 1,
// which the lock's status records.
func TestInstallBundle(t *testing.T) {
	c := start(t, "bundle")
	g := NewWithT(t)

	c.stepf("every object of dist/install.yaml is in the cluster")
	bundle := filepath.Join(c.root, "dist", "install.yaml")
	data, err := os.ReadFile(bundle)
	g.Expect(err).NotTo(HaveOccurred())
	var want []string
	for doc := range strings.SplitSeq(string(data), "\n---\n") {
		var obj struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		g.Expect(utilyaml.Unmarshal([]byte(doc), &obj)).To(Succeed())
		want = append(want, obj.Kind+"/"+obj.Metadata.Name)
	}
	out := c.kubectlOK("get", "-f", bundle, "-o", "custom-columns=KIND:.kind,NAME:.metadata.name", "--no-headers")
	var got []string
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		g.Expect(f).To(HaveLen(2), line)
		got = append(got, f[0]+"/"+f[1])
	}
	g.Expect(got).To(ConsistOf(want))
	c.stepf("%d objects", len(got))

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
