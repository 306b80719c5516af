package integration

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/utils/ptr"

	"github.com/frontdesk-dev/frontdesk/internal/cli"
	"github.com/frontdesk-dev/frontdesk/internal/controlplane"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

var (
	pluginOnce sync.Once
	pluginPath string
	pluginErr  error
)

// kubectlLock returns the path of a freshly built kubectl-dlock binary.
func kubectlLock(t *testing.T) string {
	t.Helper()
	pluginOnce.Do(func() {
		root, err := controlplane.RepoRoot()
		if err != nil {
			pluginErr = err
			return
		}
		pluginPath = filepath.Join(filepath.Dir(kubeconfigPath), "kubectl-dlock")
		build := exec.Command("go", "build", "-o", pluginPath, "./cmd/kubectl-dlock")
		build.Dir = root // with the root module's dependencies, as `make build`
		out, err := build.CombinedOutput()
		if err != nil {
			pluginErr = errors.New(string(out))
		}
	})
	if pluginErr != nil {
		t.Fatalf("building kubectl-dlock: %v", pluginErr)
	}
	return pluginPath
}

// pluginRun is a finished kubectl-dlock invocation.
type pluginRun struct {
	code           int
	stdout, stderr string
}

func runPlugin(t *testing.T, namespace string, args ...string) pluginRun {
	t.Helper()
	cmd := pluginCommand(t, namespace, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	return pluginRun{code: exitCode(t, err), stdout: out.String(), stderr: errOut.String()}
}

func pluginCommand(t *testing.T, namespace string, args ...string) *exec.Cmd {
	t.Helper()
	full := append([]string{"--kubeconfig", kubeconfigPath, "-n", namespace}, args...)
	return exec.Command(kubectlLock(t), full...)
}

func exitCode(t *testing.T, err error) int {
	t.Helper()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		return exit.ExitCode()
	default:
		t.Fatalf("running kubectl-dlock: %v", err)
		return -1
	}
}

func TestKubectlLockGetDescribeAcquireReleaseBreak(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(30).Obj())
	g := NewWithT(t)

	r := runPlugin(t, ns, "acquire", "billing", "--identity", "alice")
	g.Expect(r.code).To(Equal(0), r.stderr)
	g.Expect(r.stdout).To(ContainSubstring("acquired " + ns + "/billing as alice with fencing token 1"))

	r = runPlugin(t, ns, "acquire", "billing", "--identity", "bob")
	g.Expect(r.code).To(Equal(1))
	g.Expect(r.stderr).To(MatchRegexp(`error: lock \S+/billing is held by alice \(fencing token 1\) until ~\S+ unless it renews; ` +
		`not waiting \(--wait 0, the default\): to queue for it, pass --wait with how long, e.g. --wait 5m`))

	eventually(t, 2*time.Second, func(g Gomega) {
		r := runPlugin(t, ns, "get")
		g.Expect(r.code).To(Equal(0), r.stderr)
		g.Expect(r.stdout).To(MatchRegexp(`NAME\s+HOLDER\s+TOKEN\s+HELD\s+WAITING\s+DURATION\s+STATUS\s+AGE\n`))
		g.Expect(r.stdout).To(MatchRegexp(`billing\s+alice\s+1\s+True\s+0\s+30s\s+InSync\s`))
		g.Expect(withoutGuardWarnings(r.stderr)).To(BeEmpty())
	})
	r = runPlugin(t, ns, "get", "billing", "-o", "json")
	g.Expect(r.code).To(Equal(0), r.stderr)
	g.Expect(r.stdout).To(ContainSubstring(`"fencingToken": 1`))
	r = runPlugin(t, ns, "get", "billing", "-o", "yaml")
	g.Expect(r.stdout).To(ContainSubstring("holder: alice"))
	r = runPlugin(t, ns, "get", "billing", "-o", "xml")
	g.Expect(r.code).To(Equal(1))
	g.Expect(r.stderr).To(ContainSubstring(`unknown output format "xml": use json, yaml or wide`))

	eventually(t, 5*time.Second, func(g Gomega) {
		r := runPlugin(t, ns, "describe", "billing")
		g.Expect(r.code).To(Equal(0), r.stderr)
		g.Expect(r.stdout).To(MatchRegexp(`Holder:\s+alice`))
		g.Expect(r.stdout).To(MatchRegexp(`Fencing token:\s+1`))
		g.Expect(r.stdout).To(MatchRegexp(`Normal\s+Acquired\s+.*alice acquired the lock with fencing token 1`))
	})

	r = runPlugin(t, ns, "release", "billing", "--identity", "bob")
	g.Expect(r.code).To(Equal(1))
	g.Expect(r.stderr).To(ContainSubstring("held by alice, not bob; nothing released"))
	g.Expect(ptr.Deref(getLease(g, ns, "billing").Spec.HolderIdentity, "")).To(Equal("alice"))

	r = runPlugin(t, ns, "release", "billing")
	g.Expect(r.code).To(Equal(1))
	g.Expect(r.stderr).To(ContainSubstring("--identity is required"))

	r = runPlugin(t, ns, "release", "billing", "--identity", "alice")
	g.Expect(r.code).To(Equal(0), r.stderr)
	g.Expect(getLease(g, ns, "billing").Spec.HolderIdentity).To(BeNil())

	r = runPlugin(t, ns, "acquire", "billing", "--identity", "carol", "-o", "json")
	g.Expect(r.code).To(Equal(0), r.stderr)
	g.Expect(r.stdout).To(ContainSubstring(`"fencingToken":2`))
	r = runPlugin(t, ns, "break", "billing")
	g.Expect(r.code).To(Equal(0), r.stderr)
	g.Expect(r.stdout).To(ContainSubstring("was held by carol with fencing token 2; fencing token is now 3"))
	lease := getLease(g, ns, "billing")
	g.Expect(lease.Spec.HolderIdentity).To(BeNil())
	g.Expect(ptr.Deref(lease.Spec.LeaseTransitions, 0)).To(BeEquivalentTo(3))

	r = runPlugin(t, ns, "get", "no-such-lock")
	g.Expect(r.code).To(Equal(1))
	g.Expect(r.stderr).To(ContainSubstring(`not found`))
}

func TestKubectlLockRunPassesTokenAndExitStatus(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).Obj())
	g := NewWithT(t)

	r := runPlugin(t, ns, "run", "billing", "--identity", "job-1", "--",
		"sh", "-c", `echo "token=$FENCING_TOKEN lock=$LOCK_NAME ns=$LOCK_NAMESPACE holder=$LOCK_HOLDER"; exit 3`)
	g.Expect(r.code).To(Equal(3), r.stderr)
	g.Expect(r.stdout).To(Equal("token=1 lock=billing ns=" + ns + " holder=job-1\n"))
	g.Expect(getLease(g, ns, "billing").Spec.HolderIdentity).To(BeNil(), "the lock is released after the command")

	r = runPlugin(t, ns, "run", "billing", "--", "true")
	g.Expect(r.code).To(Equal(0), r.stderr)
	r = runPlugin(t, ns, "run", "billing", "--", "sh", "-c", "kill -KILL $$")
	g.Expect(r.code).To(Equal(128+9), "a command killed by a signal exits 128+signal")
	r = runPlugin(t, ns, "run", "billing", "--", "/no/such/command")
	g.Expect(r.code).To(Equal(cli.ExitCommandNotFound))
	g.Expect(r.stderr).To(ContainSubstring("/no/such/command: command not found"))
	r = runPlugin(t, ns, "run", "billing", "true")
	g.Expect(r.code).To(Equal(1))
	g.Expect(r.stderr).To(ContainSubstring("usage: kubectl dlock run NAME [flags] -- COMMAND [ARGS...]"))
	g.Expect(ptr.Deref(getLease(g, ns, "billing").Spec.LeaseTransitions, 0)).To(BeEquivalentTo(3), "three grants: a command not found takes none")

	// While someone else holds it, run fails at once without --wait.
	held, err := newLockClient(t, ns, "billing", "other").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	r = runPlugin(t, ns, "run", "billing", "--", "echo", "should not run")
	g.Expect(r.code).To(Equal(1))
	g.Expect(r.stdout).To(BeEmpty())
	g.Expect(r.stderr).To(ContainSubstring("is held by other"))
	g.Expect(r.stderr).To(ContainSubstring("not waiting (--wait 0, the default): to queue for it, pass --wait"))
	g.Expect(held.Release(context.Background())).To(Succeed())
}

func TestKubectlLockRunForwardsSignals(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).Obj())
	g := NewWithT(t)
	cmd := pluginCommand(t, ns, "run", "billing", "--", "sh", "-c", `trap 'echo got TERM; exit 7' TERM; echo ready; sleep 30 & wait`)
	out := outputFile(t)
	cmd.Stdout, cmd.Stderr = out.f, out.f
	g.Expect(cmd.Start()).To(Succeed())
	eventually(t, 10*time.Second, func(g Gomega) { g.Expect(out.String()).To(ContainSubstring("ready")) })
	g.Expect(cmd.Process.Signal(syscall.SIGTERM)).To(Succeed())
	g.Expect(exitCode(t, cmd.Wait())).To(Equal(7), out.String())
	g.Expect(out.String()).To(ContainSubstring("got TERM"))
	g.Expect(getLease(g, ns, "billing").Spec.HolderIdentity).To(BeNil())
}

func TestKubectlLockRunTerminatesCommandWhenLeaseLost(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(3).Obj())
	g := NewWithT(t)
	cmd := pluginCommand(t, ns, "run", "billing", "--grace", "1s", "--", "sh", "-c", `echo running; sleep 60 & wait`)
	out := outputFile(t)
	cmd.Stdout, cmd.Stderr = out.f, out.f
	g.Expect(cmd.Start()).To(Succeed())
	eventually(t, 10*time.Second, func(g Gomega) { g.Expect(out.String()).To(ContainSubstring("running")) })

	admin, err := lock.New(restConfig(), lock.Config{Namespace: ns, Name: "billing", Identity: "admin"})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = admin.Break(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	broken := time.Now()

	g.Expect(exitCode(t, cmd.Wait())).To(Equal(cli.ExitLeaseLost), out.String())
	g.Expect(out.String()).To(ContainSubstring("lease on " + ns + "/billing lost"))
	g.Expect(out.String()).To(ContainSubstring("SIGKILL to sh's process group"))
	g.Expect(time.Since(broken)).To(BeNumerically("<", 3*time.Second), "broken: the command is killed at once, when the next renewal (within 1s) finds out")
}

// capturedOutput is a file a child process writes to directly (a
// *os.File, so exec.Cmd.Wait does not wait on a pipe that an orphaned
// grandchild may hold open).
type capturedOutput struct {
	f *os.File
}

func outputFile(t *testing.T) *capturedOutput {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return &capturedOutput{f: f}
}

func (c *capturedOutput) String() string {
	b, _ := os.ReadFile(c.f.Name())
	return string(b)
}

// withoutGuardWarnings is the plugin's stderr without its warnings that a
// lock is not guarded: most of this suite runs in namespaces the lease
// guard's bindings do not select, where every lock says so.
func withoutGuardWarnings(stderr string) string {
	var kept []string
	for line := range strings.Lines(stderr) {
		if !strings.Contains(line, ": not guarded: ") {
			kept = append(kept, line)
		}
	}
	return strings.Join(kept, "")
}
