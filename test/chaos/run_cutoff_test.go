package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/frontdesk-dev/frontdesk/internal/cli"
	"github.com/frontdesk-dev/frontdesk/internal/controlplane"
	"github.com/frontdesk-dev/frontdesk/test/internal/harness"
)

var (
	kubectlLockOnce sync.Once
	kubectlLockPath string
	kubectlLockErr  error
)

// kubectlLock builds the kubectl-dlock plugin once per run.
func kubectlLock(t *testing.T) string {
	t.Helper()
	kubectlLockOnce.Do(func() {
		root, err := controlplane.RepoRoot()
		if err != nil {
			kubectlLockErr = err
			return
		}
		kubectlLockPath = filepath.Join(workDir, "kubectl-dlock")
		build := exec.Command("go", "build", "-o", kubectlLockPath, "./cmd/kubectl-dlock")
		build.Dir = root // with the root module's dependencies, as `make build`
		if out, err := build.CombinedOutput(); err != nil {
			kubectlLockErr = fmt.Errorf("%w: %s", err, out)
		}
	})
	if kubectlLockErr != nil {
		t.Fatalf("building kubectl-dlock: %v", kubectlLockErr)
	}
	return kubectlLockPath
}

// runningPlugin is one `kubectl dlock run` process and its exit status.
type runningPlugin struct {
	name   string
	cmd    *exec.Cmd
	out    string // file with its stdout and stderr
	proxy  *proxy
	exited chan int
	done   chan struct{} // closed once it exited
}

func (p *runningPlugin) output() string {
	b, _ := os.ReadFile(p.out)
	return string(b)
}

// kubectl dlock run cut off from the apiserver round after round. Each
// round, the holder's proxy fails (black hole, resets, delays past the
// lease, in turn) while its kubectl dlock run keeps running, and the next
// kubectl dlock run waits for the lock. Every command ignores SIGTERM and
// appends "<its token> <time>" to one ledger file (O_APPEND: the order of
// its lines is the order of the writes). The old holder's command must be
// killed before the next holder's command starts: no line with a token
// lower than one already written, ever. The last holder ends by SIGINT.
func TestRunCutOffFromTheAPIServer(t *testing.T) {
	c := suite
	ns := newNamespace(t, c)
	const lockName = "job"
	ctx := context.Background()
	history := createLockWithHistory(t, c, ns, lockName, 3)
	defer history.Stop()
	dir := t.TempDir()
	ledger := filepath.Join(dir, "ledger")
	binary := kubectlLock(t)

	start := func(i int) *runningPlugin {
		p := &runningPlugin{name: fmt.Sprintf("run-%d", i), out: filepath.Join(dir, fmt.Sprintf("run-%d.out", i)), exited: make(chan int, 1), done: make(chan struct{})}
		var kubeconfig string
		p.proxy, kubeconfig = proxiedKubeconfig(t, c.kubeconfigPath, p.name)
		t.Cleanup(p.proxy.Close)
		out, err := os.Create(p.out)
		if err != nil {
			t.Fatal(err)
		}
		defer out.Close()
		p.cmd = exec.Command(binary, "--kubeconfig", kubeconfig, "-n", ns, "run", lockName, "--identity", p.name, "--wait", "1m", "--",
			"sh", "-c", `trap '' TERM; while :; do echo "$FENCING_TOKEN $(date +%s%N)" >> "$0"; sleep 0.01; done`, ledger)
		p.cmd.Stdout, p.cmd.Stderr = out, out
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			err := p.cmd.Wait()
			code := 0
			if exit, ok := errors.AsType[*exec.ExitError](err); ok {
				code = exit.ExitCode()
			}
			p.exited <- code
			close(p.done)
		}()
		t.Cleanup(func() {
			select {
			case <-p.done:
			default:
				_ = p.cmd.Process.Kill()
				<-p.done
			}
		})
		return p
	}
	// writing reports whether a token above after has reached the ledger.
	writing := func(after int64) func() bool {
		return func() bool {
			lines := readRunLedger(t, ledger)
			return len(lines) > 0 && lines[len(lines)-1].token > after
		}
	}

	modes := []faultMode{blackhole, drop, delay}
	cur := start(0)
	waitFor(t, time.Minute, "run-0's command to write", writing(0))
	for i := range size(2, 9) {
		lines := readRunLedger(t, ledger)
		token := lines[len(lines)-1].token
		mode := modes[i%len(modes)]
		appendLedger(t, ledger, fmt.Sprintf("cut %d", time.Now().UnixNano()))
		cur.proxy.Fail(mode)
		next := start(i + 1)
		select {
		case code := <-cur.exited:
			if code != cli.ExitLeaseLost {
				t.Errorf("%s, cut off (%s), exited %d, not %d: %s", cur.name, mode, code, cli.ExitLeaseLost, cur.output())
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s, cut off (%s) holding token %d, still runs: %s", cur.name, mode, token, cur.output())
		}
		waitFor(t, time.Minute, next.name+"'s command to write", writing(token))
		t.Logf("%s cut off (%s) holding token %d: %s", cur.name, mode, token, lastLine(cur.output()))
		cur = next
	}
	_ = cur.cmd.Process.Signal(syscall.SIGINT)
	select {
	case code := <-cur.exited:
		if code != 128+int(syscall.SIGINT) {
			t.Errorf("%s exited %d on SIGINT, not %d: %s", cur.name, code, 128+int(syscall.SIGINT), cur.output())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not exit on SIGINT: %s", cur.name, cur.output())
	}
	checkRunLedger(t, readRunLedger(t, ledger))
	checkRunGrants(t, history, size(2, 9)+1)
	lease, err := c.clientset.CoordinationV1().Leases(ns).Get(ctx, lockName, metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity != nil {
		t.Errorf("the last holder did not release the lock on SIGINT: %v %v", lease.Spec.HolderIdentity, err)
	}
}

// runLedgerLine is a line of the run ledger: a command's write (token, and
// when, wall-clock ns), or a cut made by the test (token -1).
type runLedgerLine struct {
	token int64
	at    int64
}

func appendLedger(t *testing.T, path, line string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(line + "\n"); err != nil {
		t.Fatal(err)
	}
}

func readRunLedger(t *testing.T, path string) []runLedgerLine {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var lines []runLedgerLine
	for l := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			t.Fatalf("ledger line %q", l)
		}
		token, err := strconv.ParseInt(f[0], 10, 64)
		if f[0] == "cut" {
			token, err = -1, nil
		}
		at, err2 := strconv.ParseInt(f[1], 10, 64)
		if err != nil || err2 != nil {
			t.Fatalf("ledger line %q", l)
		}
		lines = append(lines, runLedgerLine{token: token, at: at})
	}
	return lines
}

// checkRunLedger: no write of a holder's command after the first write of
// the next holder's command; after each cut, the old command went on
// writing (it ignores SIGTERM) until it was killed.
func checkRunLedger(t *testing.T, lines []runLedgerLine) {
	t.Helper()
	var highest int64
	last := map[int64]int{} // last line of each token
	first := map[int64]int{}
	var tokens []int64
	cuts := 0
	for i, l := range lines {
		if l.token < 0 {
			cuts++
			continue
		}
		if l.token < highest {
			t.Errorf("ledger line %d: a write with token %d after the command holding token %d had started", i, l.token, highest)
		}
		if _, seen := first[l.token]; !seen {
			first[l.token] = i
			tokens = append(tokens, l.token)
		}
		last[l.token] = i
		highest = max(highest, l.token)
	}
	if len(tokens) != cuts+1 {
		t.Errorf("%d commands wrote to the ledger, want %d (one per cut, and the last)", len(tokens), cuts+1)
	}
	var margins []string
	for k := 0; k+1 < len(tokens); k++ {
		old, next := tokens[k], tokens[k+1]
		afterCut := 0
		for i := first[old]; i <= last[old]; i++ {
			if lines[i].token < 0 {
				afterCut = last[old] - i
			}
		}
		if afterCut == 0 {
			t.Errorf("the command holding token %d wrote nothing after its kubectl dlock run was cut off", old)
		}
		margins = append(margins, fmt.Sprintf("%d->%d: %s (%d writes after the cut)", old, next,
			time.Duration(lines[first[next]].at-lines[last[old]].at).Round(time.Millisecond), afterCut))
	}
	t.Logf("ledger: %d writes; from the old command's last write to the next command's first: %s", len(lines)-cuts, strings.Join(margins, ", "))
}

// checkRunGrants: the Lease granted the lock to run-0, run-1, ... in
// turn, with increasing tokens.
func checkRunGrants(t *testing.T, history *harness.LeaseHistory, plugins int) {
	t.Helper()
	grants := history.Grants()
	holders := make([]string, 0, len(grants))
	var last int32
	for _, g := range grants {
		holders = append(holders, g.Holder)
		if g.Token <= last {
			t.Errorf("grant to %s with token %d, not above %d", g.Holder, g.Token, last)
		}
		last = g.Token
	}
	want := make([]string, 0, plugins)
	for i := range plugins {
		want = append(want, fmt.Sprintf("run-%d", i))
	}
	if strings.Join(holders, " ") != strings.Join(want, " ") {
		t.Errorf("the Lease was granted to %v, want %v", holders, want)
	}
}

// lastLine is the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
