//go:build e2e

// Package e2e deploys frontdesk to a kind cluster and runs the billing
// scenario as real pods. It needs a container runtime (docker); without one
// it skips, saying so. Run it with `make test-e2e`.
package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/kind/pkg/cluster"
	"sigs.k8s.io/kind/pkg/cmd"
	load "sigs.k8s.io/kind/pkg/cmd/kind/load/docker-image"

	"github.com/frontdesk-dev/frontdesk/internal/controlplane"
	"github.com/frontdesk-dev/frontdesk/internal/demo"
)

const clusterName = "frontdesk-e2e"

type env struct {
	t          *testing.T
	root       string
	kubeconfig string
}

func TestBillingScenarioOnKind(t *testing.T) {
	if out, err := exec.Command("docker", "info").CombinedOutput(); err != nil {
		t.Skipf("skipping the kind e2e test: no container runtime (docker info: %v: %s)", err, errorLine(out))
	}
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, root: root, kubeconfig: filepath.Join(t.TempDir(), "kubeconfig")}

	provider := cluster.NewProvider()
	e.step("creating kind cluster %s", clusterName)
	if err := provider.Create(clusterName, cluster.CreateWithWaitForReady(3*time.Minute), cluster.CreateWithKubeconfigPath(e.kubeconfig)); err != nil {
		t.Fatalf("creating kind cluster: %v", err)
	}
	defer func() {
		if t.Failed() {
			dir := filepath.Join(root, "bin", "e2e-logs")
			e.step("exporting cluster logs to %s", dir)
			_ = provider.CollectLogs(clusterName, dir)
			_ = e.kubectlOK("get", "all,dlock,lease,events", "-A")
		}
		e.step("deleting kind cluster %s", clusterName)
		_ = provider.Delete(clusterName, e.kubeconfig)
	}()

	for _, img := range []struct{ tag, dockerfile string }{
		{"frontdesk-controller:e2e", "Dockerfile"},
		{"frontdesk-demo:e2e", "Dockerfile.demo"},
	} {
		e.step("building %s", img.tag)
		e.run("docker", "build", "-t", img.tag, "-f", img.dockerfile, ".")
		loader := load.NewCommand(cmd.NewLogger(), cmd.StandardIOStreams())
		loader.SetArgs([]string{img.tag, "--name", clusterName})
		if err := loader.Execute(); err != nil {
			t.Fatalf("loading %s into kind: %v", img.tag, err)
		}
	}

	e.step("deploying config/default")
	manifests := e.run(filepath.Join(root, "bin", "k8s", "kubectl"), "kustomize", "config/default")
	manifests = strings.ReplaceAll(manifests, "image: controller:latest", "image: frontdesk-controller:e2e\n        imagePullPolicy: Never")
	e.apply(manifests)
	e.kubectlOK("-n", "frontdesk-system", "rollout", "status", "deployment/frontdesk-controller-manager", "--timeout=3m")

	e.step("starting the billing scenario: ledger and 10 workers")
	data, err := os.ReadFile(filepath.Join(root, "test", "e2e", "testdata", "billing.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	e.apply(string(data))
	e.kubectlOK("-n", "billing-e2e", "rollout", "status", "deployment/ledger", "--timeout=3m")
	e.kubectlOK("-n", "billing-e2e", "rollout", "status", "deployment/worker", "--timeout=3m")

	// Freeze the holder at 70% of the customers, for real.
	var frozenPod string
	var frozenToken int64
	e.poll(5*time.Minute, func() bool {
		holderPod, token := e.holder()
		st := e.stats()
		if holderPod == "" || st.Customers == 0 || st.Charges < st.Customers*7/10 {
			return false
		}
		e.kubectlOK("-n", "billing-e2e", "exec", holderPod, "--", "pkill", "-STOP", "-x", "frontdesk-demo")
		frozenPod, frozenToken = holderPod, token
		e.step("froze %s (token %d) after %d charges", holderPod, token, st.Charges)
		return true
	})
	e.poll(2*time.Minute, func() bool { _, token := e.holder(); return token > frozenToken })
	e.kubectlOK("-n", "billing-e2e", "exec", frozenPod, "--", "pkill", "-CONT", "-x", "frontdesk-demo")
	e.step("lease passed on; thawed %s", frozenPod)

	var final demo.Stats
	e.poll(5*time.Minute, func() bool { final = e.stats(); return final.Complete })
	time.Sleep(5 * time.Second) // let the thawed worker's late writes reach the ledger before counting; the count follows
	final = e.stats()
	e.step("ledger: %+v", final)
	if final.Duplicates != 0 || final.ChargedOnce != final.Customers || final.NeverCharged != 0 {
		t.Errorf("with fencing: %d duplicate charges, %d of %d customers charged exactly once", final.Duplicates, final.ChargedOnce, final.Customers)
	}
	if final.Rejected == 0 {
		t.Errorf("the thawed worker's stale writes were not rejected (rejected = 0)")
	}
}

func (e *env) step(format string, args ...any) {
	e.t.Logf("[%s] %s", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// run runs a command in the repository root and returns its stdout.
func (e *env) run(name string, args ...string) string {
	e.t.Helper()
	c := exec.Command(name, args...)
	c.Dir = e.root
	c.Stderr = os.Stderr
	out, err := c.Output()
	if err != nil {
		e.t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	return string(out)
}

func (e *env) kubectl(args ...string) (string, error) {
	c := exec.Command(filepath.Join(e.root, "bin", "k8s", "kubectl"), append([]string{"--kubeconfig", e.kubeconfig}, args...)...)
	out, err := c.CombinedOutput()
	return string(out), err
}

func (e *env) kubectlOK(args ...string) string {
	e.t.Helper()
	out, err := e.kubectl(args...)
	if err != nil {
		e.t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (e *env) apply(manifests string) {
	e.t.Helper()
	c := exec.Command(filepath.Join(e.root, "bin", "k8s", "kubectl"), "--kubeconfig", e.kubeconfig, "apply", "--server-side", "-f", "-")
	c.Stdin = strings.NewReader(manifests)
	if out, err := c.CombinedOutput(); err != nil {
		e.t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
}

// holder is the lock's holder pod and fencing token, from its status.
func (e *env) holder() (string, int64) {
	out, err := e.kubectl("-n", "billing-e2e", "get", "dlock", "billing", "-o", "jsonpath={.status.holderPod} {.status.fencingToken}")
	if err != nil {
		return "", 0
	}
	fields := strings.Fields(out)
	if len(fields) != 2 {
		return "", 0
	}
	token, _ := strconv.ParseInt(fields[1], 10, 64)
	return fields[0], token
}

// stats reads the ledger's counts through its pod.
func (e *env) stats() demo.Stats {
	out, err := e.kubectl("-n", "billing-e2e", "exec", "deploy/ledger", "--", "wget", "-qO-", "http://127.0.0.1:8080/stats")
	var st demo.Stats
	if err == nil {
		_ = json.Unmarshal([]byte(out), &st)
	}
	return st
}

// poll calls fn every second until it returns true or timeout passes.
func (e *env) poll(timeout time.Duration, fn func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for !fn() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out after %s", timeout)
		}
		time.Sleep(time.Second) // polling interval
	}
}

// errorLine picks the line of docker's output that says what is wrong.
func errorLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	for _, l := range lines {
		if strings.Contains(strings.ToLower(l), "error") || strings.Contains(l, "Cannot connect") {
			return strings.TrimSpace(l)
		}
	}
	return strings.TrimSpace(lines[len(lines)-1])
}
