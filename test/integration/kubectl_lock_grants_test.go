package integration

// Every grant works as a new user tries it: kubectl dlock run on the shortest
// leases, hand-offs, a crowd started at once, one identity twice; repeated
// to show a rate, and again with a CPU hog on one core.

import (
	"bytes"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/frontdesk-dev/frontdesk/internal/testutil"
)

// cpuHog keeps one core busy until the test ends (pinned to core 0 where
// taskset exists), as a noisy neighbour does.
func cpuHog(t *testing.T) {
	t.Helper()
	cmd := exec.Command("sh", "-c", "exec yes >/dev/null")
	if path, err := exec.LookPath("taskset"); err == nil {
		cmd = exec.Command(path, "-c", "0", "sh", "-c", "exec yes >/dev/null")
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the CPU hog: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
}

// runResult is a finished kubectl dlock run.
type runResult struct {
	name   string
	code   int
	stderr string
	lines  []string // what its command wrote to its log
}

// startRun starts kubectl dlock run on lock, with its command appending a
// line with its token when it starts and when it ends to log.
func startRun(t *testing.T, ns, lock, identity, log string, hold time.Duration, args ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	script := fmt.Sprintf(`echo "start $FENCING_TOKEN $LOCK_HOLDER" >> %[1]s; sleep %[2]s; echo "end $FENCING_TOKEN $LOCK_HOLDER" >> %[1]s`,
		log, strconv.FormatFloat(hold.Seconds(), 'f', 3, 64))
	full := append([]string{"run", lock}, args...)
	if identity != "" {
		full = append(full, "--identity", identity)
	}
	cmd := pluginCommand(t, ns, append(full, "--", "sh", "-c", script)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, &stderr
}

// A hand-off on a short lease keeps its new holder: A holds for 1 s, B
// queues 0.3 s after A's grant and runs for most of a lease. The
// handed-off grant's window counts from B's registration, so its first
// renewal must come where a grant written then would be renewed: a renewal
// a renew interval after the hand-off would fall after the plugin's SIGTERM
// deadline, and B would exit 75. Ten pairs at once, on locks of their own,
// at 2 s and 3 s leases, and again with a CPU hog.
func TestKubectlLockRunHandOffOnShortLeasesKeepsTheNewHolder(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lease int32
		hog   bool
	}{{"2s", 2, false}, {"3s", 3, false}, {"3s with a CPU hog", 3, true}} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.hog {
				cpuHog(t)
			}
			const pairs = 10
			ns := newNamespace(t)
			dir := t.TempDir()
			var wg sync.WaitGroup
			results := make(chan runResult, 2*pairs)
			for i := range pairs {
				name := fmt.Sprintf("cu-%d", i)
				createReadyLock(t, testutil.MakeLock(name, ns).LeaseDuration(tc.lease).Obj())
				log := filepath.Join(dir, name+".log")
				wg.Go(func() {
					a, aErr := startRun(t, ns, name, "A", log, time.Second)
					// B arrives while A holds, 0.3 s into its grant, as in
					// the report (after A's command started: a process that
					// starts slowly under the hog must not find B first).
					started := time.Now()
					for !strings.Contains(strings.Join(readLines(t, log), "\n"), "start") && time.Since(started) < 10*time.Second {
						time.Sleep(20 * time.Millisecond)
					}
					time.Sleep(300 * time.Millisecond)
					b, bErr := startRun(t, ns, name, "B", log, time.Duration(tc.lease)*time.Second*5/6, "--wait", "20s")
					for _, r := range []struct {
						who    string
						cmd    *exec.Cmd
						stderr *bytes.Buffer
					}{{"A", a, aErr}, {"B", b, bErr}} {
						err := r.cmd.Wait()
						results <- runResult{name: name + "/" + r.who, code: exitCode(t, err), stderr: r.stderr.String(), lines: readLines(t, log)}
					}
				})
			}
			wg.Wait()
			close(results)
			g := NewWithT(t)
			failed := 0
			for r := range results {
				if r.code != 0 {
					failed++
					t.Errorf("%s exited %d: %s", r.name, r.code, r.stderr)
				}
			}
			t.Logf("lease %ds: %d of %d runs failed", tc.lease, failed, 2*pairs)
			g.Expect(failed).To(BeZero())
		})
	}
}

// readLines reads the lines of a log the runs' commands wrote.
func readLines(t *testing.T, path string) []string {
	t.Helper()
	out, err := exec.Command("cat", path).Output()
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// A crowd of kubectl dlock run started at once on a 3 s lock, each command
// running for 40 % of the lease: every one gets the lock in turn, none exits
// 75 (a waiter that waited long at the front of the queue keeps its
// hand-off rather than being SIGTERMed soon after it), the commands never
// overlap, and the tokens rise. Two runs of twelve.
func TestKubectlLockRunCrowdOnAShortLeaseAllSucceed(t *testing.T) {
	const runs, crowd = 2, 12
	for run := range runs {
		ns := newNamespace(t)
		createReadyLock(t, testutil.MakeLock("crowd", ns).LeaseDuration(3).Obj())
		log := filepath.Join(t.TempDir(), "crowd.log")
		type started struct {
			cmd    *exec.Cmd
			stderr *bytes.Buffer
		}
		all := make([]started, 0, crowd)
		for i := range crowd {
			cmd, stderr := startRun(t, ns, "crowd", fmt.Sprintf("w%02d", i), log, 1200*time.Millisecond, "--wait", "60s")
			all = append(all, started{cmd, stderr})
		}
		g := NewWithT(t)
		for i, s := range all {
			if code := exitCode(t, s.cmd.Wait()); code != 0 {
				t.Errorf("run %d, w%02d exited %d: %s", run, i, code, s.stderr.String())
			}
		}
		lines := readLines(t, log)
		g.Expect(lines).To(HaveLen(2 * crowd))
		expectSerialRising(g, lines)
	}
}

// expectSerialRising checks a log of "start T H" / "end T H" lines: each
// start is followed by the end of the same holder before the next start,
// and the tokens rise.
func expectSerialRising(g Gomega, lines []string) {
	last := int64(0)
	for i := 0; i+1 < len(lines); i += 2 {
		s, e := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		g.ExpectWithOffset(1, s[0]).To(Equal("start"), "line %d: %v", i, lines)
		g.ExpectWithOffset(1, e[0]).To(Equal("end"), "two commands ran at once: %v", lines)
		g.ExpectWithOffset(1, e[1:]).To(Equal(s[1:]))
		token, err := strconv.ParseInt(s[1], 10, 64)
		g.ExpectWithOffset(1, err).NotTo(HaveOccurred())
		g.ExpectWithOffset(1, token).To(BeNumerically(">", last), "tokens rise: %v", lines)
		last = token
	}
}

// One identity twice: a second live kubectl dlock run under an identity
// already holding (or queued) is refused with an error that says so, and
// exits non-zero without touching anyone's grant; a third waiter with an
// identity of its own gets the lock after the holder, and keeps it.
func TestKubectlLockRunRefusesAnIdentityAlreadyInUse(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(3).Obj())
	log := filepath.Join(t.TempDir(), "billing.log")
	first, firstErr := startRun(t, ns, "billing", "same", log, 3*time.Second)
	g := NewWithT(t)
	eventually(t, 10*time.Second, func(g Gomega) { g.Expect(readLines(t, log)).To(HaveLen(1)) })
	third, thirdErr := startRun(t, ns, "billing", "other", log, 2*time.Second, "--wait", "30s")
	second := runPlugin(t, ns, "run", "billing", "--identity", "same", "--wait", "20s", "--", "true")
	g.Expect(second.code).NotTo(BeZero())
	g.Expect(second.stderr).To(ContainSubstring(`under identity "same", this client's`))
	g.Expect(second.stderr).To(ContainSubstring("give each process an identity of its own"))
	// A second waiter under the identity of one already queued.
	queuedTwice := runPlugin(t, ns, "run", "billing", "--identity", "other", "--wait", "20s", "--", "true")
	g.Expect(queuedTwice.code).NotTo(BeZero())
	g.Expect(queuedTwice.stderr).To(ContainSubstring(`waits for it at position 0 of its queue under identity "other"`))
	g.Expect(exitCode(t, first.Wait())).To(BeZero(), firstErr.String())
	g.Expect(exitCode(t, third.Wait())).To(BeZero(), thirdErr.String())
	lines := readLines(t, log)
	g.Expect(lines).To(HaveLen(4))
	expectSerialRising(g, lines)
	holders := []string{strings.Fields(lines[0])[2], strings.Fields(lines[2])[2]}
	slices.Sort(holders)
	g.Expect(holders).To(Equal([]string{"other", "same"}))
}
