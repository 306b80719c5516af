package integration

// kubectl dlock run stalled (SIGSTOP of the plugin alone, not its command):
// the watchdog's deadline, which only the plugin extends, still ends the
// command before the lease can lapse for anyone else.

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/frontdesk-dev/frontdesk/internal/cli"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
)

// liveGroupMembers lists the processes of group pgid that are running (not
// zombies).
func liveGroupMembers(g Gomega, pgid int) []int {
	entries, err := os.ReadDir("/proc")
	g.Expect(err).NotTo(HaveOccurred())
	var live []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid pgrp ...
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if f[2] == strconv.Itoa(pgid) && f[0] != "Z" && f[0] != "X" {
			live = append(live, pid)
		}
	}
	return live
}

// The plugin, and only the plugin, is stopped (SIGSTOP) for longer than its
// 3s lease while its command appends to a ledger in a loop, and another
// kubectl dlock run waits for the lock. The watchdog's deadline passes
// without extension: it SIGKILLs the group, so the old command's last write
// comes before the next holder's command starts, and no process of the old
// group is running while the plugin is still stopped.
func TestKubectlLockRunStalledPluginKillsCommandBeforeNextHolder(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(3).Obj())
	g := NewWithT(t)
	dir := t.TempDir()
	ledger, shPid := filepath.Join(dir, "ledger"), filepath.Join(dir, "sh")

	old := pluginCommand(t, ns, "run", "billing", "--identity", "old", "--",
		"sh", "-c", `echo $$ > "$1"; trap '' TERM; while :; do echo "old $FENCING_TOKEN $(date +%s%N)" >> "$0"; sleep 0.01; done`, ledger, shPid)
	oldOut := outputFile(t)
	old.Stdout, old.Stderr = oldOut.f, oldOut.f
	g.Expect(old.Start()).To(Succeed())
	t.Cleanup(func() {
		_ = old.Process.Signal(syscall.SIGCONT)
		_ = old.Process.Kill()
	})
	eventually(t, 10*time.Second, func(g Gomega) { g.Expect(readLedger(g, ledger)).NotTo(BeEmpty()) })
	pgid := processGroupOf(g, readPid(g, shPid))

	next := pluginCommand(t, ns, "run", "billing", "--identity", "next", "--wait", "30s", "--",
		"sh", "-c", `echo "new $FENCING_TOKEN $(date +%s%N)" >> "$0"`, ledger)
	nextOut := outputFile(t)
	next.Stdout, next.Stderr = nextOut.f, nextOut.f
	g.Expect(next.Start()).To(Succeed())
	t.Cleanup(func() { _ = next.Process.Kill() })
	eventually(t, 10*time.Second, func(g Gomega) { g.Expect(nextOut.String()).To(ContainSubstring("waiting up to 30s")) })

	g.Expect(syscall.Kill(old.Process.Pid, syscall.SIGSTOP)).To(Succeed())
	stopped := time.Now()
	nextExited := make(chan int, 1)
	go func() { nextExited <- exitCode(t, next.Wait()) }()
	g.Eventually(nextExited).WithTimeout(30*time.Second).Should(Receive(Equal(0)), nextOut.String())
	live := liveGroupMembers(g, pgid)
	// Stopped for 8s in all, well past the 3s lease: the old command stays
	// dead however long its plugin stalls.
	time.Sleep(time.Until(stopped.Add(8 * time.Second)))
	live = append(live, liveGroupMembers(g, pgid)...)
	stoppedFor := time.Since(stopped)
	g.Expect(syscall.Kill(old.Process.Pid, syscall.SIGCONT)).To(Succeed())
	oldCode := exitCode(t, old.Wait())

	lines := readLedger(g, ledger)
	lastOld, newAt := -1, -1
	for i, l := range lines {
		switch l.who {
		case "old":
			lastOld = i
		case "new":
			newAt = i
		}
	}
	g.Expect(lastOld).To(BeNumerically(">=", 0))
	g.Expect(newAt).To(BeNumerically(">=", 0))
	// Positive: the old command's last write came that long before the
	// next holder's command started; negative: that long after.
	gap := time.Duration(lines[newAt].at - lines[lastOld].at)
	t.Logf("plugin stopped %s; the old command's last write (token %d) came %s before the next holder's command (token %d) started",
		stoppedFor.Round(time.Millisecond), lines[lastOld].token, gap.Round(time.Millisecond), lines[newAt].token)

	g.Expect(live).To(BeEmpty(), "processes of the old command's group run while its plugin is stopped")
	g.Expect(newAt).To(Equal(len(lines)-1), "a write of the old holder's command came after the next holder's command started")
	g.Expect(gap).To(BeNumerically(">", 0))
	g.Expect(lines[newAt].token).To(BeNumerically(">", lines[lastOld].token))
	g.Expect(oldCode).To(Equal(cli.ExitLeaseLost), oldOut.String())
	g.Expect(syscall.Kill(-pgid, 0)).To(MatchError(syscall.ESRCH), "the old command's group is gone once its plugin exited")
	g.Expect(oldOut.String()).To(ContainSubstring("did not extend the deadline of its command's process group"))
}

// How long `kubectl dlock run NAME -- true` takes end to end, acquire and
// release included (FRONTDESK_MEASURE_RUN=N runs it N times and logs the
// mean and the fastest; skipped otherwise).
func TestKubectlLockRunStartupCost(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("FRONTDESK_MEASURE_RUN"))
	if n <= 0 {
		t.Skip("set FRONTDESK_MEASURE_RUN=N to measure")
	}
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).Obj())
	kubectlLock(t) // built before timing
	var total, fastest time.Duration
	for i := range n {
		start := time.Now()
		out, err := exec.Command(kubectlLock(t), "--kubeconfig", kubeconfigPath, "-n", ns, "run", "billing", "--", "true").CombinedOutput()
		took := time.Since(start)
		if err != nil {
			t.Fatalf("run %d: %v: %s", i, err, out)
		}
		total += took
		if i == 0 || took < fastest {
			fastest = took
		}
	}
	t.Logf("kubectl dlock run -- true, %d runs: mean %s, fastest %s", n, (total / time.Duration(n)).Round(100*time.Microsecond), fastest.Round(100*time.Microsecond))
}
