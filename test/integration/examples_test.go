package integration

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/frontdesk-dev/frontdesk/internal/controlplane"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
)

var (
	examplesOnce sync.Once
	examplesDir  string
	examplesErr  error
)

// examplePrograms builds the Go programs of examples/ once, with that
// module's own requirements as a user's copy has them, and returns the
// directory that holds them (sql-worker, fenced-leader, ledger).
func examplePrograms(t *testing.T) string {
	t.Helper()
	examplesOnce.Do(func() {
		root, err := controlplane.RepoRoot()
		if err != nil {
			examplesErr = err
			return
		}
		examplesDir = filepath.Join(filepath.Dir(kubeconfigPath), "examples")
		build := exec.Command("go", "build", "-o", examplesDir+string(filepath.Separator), "./sql-worker", "./fenced-leader", "./shell/ledger")
		build.Dir = filepath.Join(root, "examples") // the examples' own module
		if out, err := build.CombinedOutput(); err != nil {
			examplesErr = fmt.Errorf("%w\n%s", err, out)
		}
	})
	if examplesErr != nil {
		t.Fatalf("building examples/: %v", examplesErr)
	}
	return examplesDir
}

// startLedger starts examples/shell/ledger on a free port and returns its
// URL.
func startLedger(t *testing.T, lockName string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(examplePrograms(t), "ledger"), "--addr", "127.0.0.1:0", "--lock", lockName)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("the ledger did not say where it listens: %v", err)
	}
	_, url, ok := strings.Cut(strings.TrimSpace(line), " listening on ")
	if !ok {
		t.Fatalf("unexpected first line from the ledger: %q", line)
	}
	return url
}

// The shell example, as its README runs it: a POSIX shell script under
// `kubectl dlock run` sends $FENCING_TOKEN to an HTTP service guarded by
// pkg/fencing's middleware. Each run is a new grant with a higher token;
// the script run with the token of an earlier grant (a holder that paused
// past its lease) is refused and says so.
func TestShellExampleWritesThroughTheFencedLedger(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("the shell example uses curl, which is not installed")
	}
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(root, "examples", "shell", "charge.sh")
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).Obj())
	g := NewWithT(t)
	url := startLedger(t, "billing")

	r := runPlugin(t, ns, "run", "billing", "--", script, url, "customer-1", "100")
	g.Expect(r.code).To(Equal(0), r.stderr)
	g.Expect(r.stdout).To(Equal("charged customer-1 100 (fencing token 1)\n"))
	r = runPlugin(t, ns, "run", "billing", "--", script, url, "customer-2", "250")
	g.Expect(r.code).To(Equal(0), r.stderr)
	g.Expect(r.stdout).To(Equal("charged customer-2 250 (fencing token 2)\n"))

	// The first holder, paused past its lease, wakes up and writes with its
	// token.
	late := exec.Command(script, url, "customer-1", "100")
	late.Env = append(os.Environ(), "FENCING_TOKEN=1", "LOCK_NAME=billing")
	var stdout, stderr bytes.Buffer
	late.Stdout, late.Stderr = &stdout, &stderr
	g.Expect(exitCode(t, late.Run())).To(Equal(75), stderr.String())
	g.Expect(stdout.String()).To(BeEmpty())
	g.Expect(stderr.String()).To(ContainSubstring("the ledger refused fencing token 1 of lock billing: a newer holder has written"))
	g.Expect(stderr.String()).To(ContainSubstring(`"currentToken":2`))

	// Not run under kubectl dlock run: refused before any write.
	bare := exec.Command(script, url, "customer-3", "1")
	bare.Env = envWithout(os.Environ(), "FENCING_TOKEN=")
	out, err := bare.CombinedOutput()
	g.Expect(exitCode(t, err)).To(Equal(64))
	g.Expect(string(out)).To(ContainSubstring("FENCING_TOKEN is not set"))

	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url + "/charges")
	g.Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(body)).To(Equal("customer-1 100 1\ncustomer-2 250 2\n"), "only the current holders' charges were recorded")
}

// envWithout is env without the variables that start with prefix.
func envWithout(env []string, prefix string) []string {
	var out []string
	for _, e := range env {
		if !strings.HasPrefix(e, prefix) {
			out = append(out, e)
		}
	}
	return out
}
