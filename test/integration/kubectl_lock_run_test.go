package integration

// kubectl dlock run and the processes of its command: the command's process
// group is dead before the lease can lapse for anyone else, and before the
// lock is released; whatever ends it (the command's exit, a signal, renewals
// cut off, kubectl dlock run killed).

import (
	"bytes"
	"context"
	"errors"
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
	"k8s.io/utils/ptr"

	"github.com/frontdesk-dev/frontdesk/internal/cli"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/test/internal/harness"
)

// appendLine appends line to the file at path with one O_APPEND write, so
// that lines of concurrent writers never interleave.
func appendLine(path, line string) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		panic(err)
	}
	defer f.Close()
	if _, err := f.WriteString(line + "\n"); err != nil {
		panic(err)
	}
}

// processDead reports whether pid has exited (a zombie, or reaped).
func processDead(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	rest := string(b[bytes.LastIndexByte(b, ')')+1:])
	state := strings.Fields(rest)[0]
	return state == "Z" || state == "X"
}

// readPid reads a pid a command wrote to path.
func readPid(g Gomega, path string) int {
	b, err := os.ReadFile(path)
	g.Expect(err).NotTo(HaveOccurred())
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	g.Expect(err).NotTo(HaveOccurred())
	return pid
}

// processGroupOf is the process group of pid.
func processGroupOf(g Gomega, pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	g.Expect(err).NotTo(HaveOccurred())
	// pid (comm) state ppid pgrp ...
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	pgid, err := strconv.Atoi(f[2])
	g.Expect(err).NotTo(HaveOccurred())
	return pgid
}

// What the command leaves behind in its process group is SIGKILLed and
// reaped before the lock is released: when the command exits by itself,
// and when SIGINT (forwarded to the group) ends it. The command leaves a
// background job (sleep 33 &, which ignores SIGINT as background jobs of a
// non-interactive shell do). And the test puts a probe of its own into the
// command's group: a process whose parent is the test, so it stays a zombie
// until the test reaps it. Until then kubectl dlock run must hold the lock:
// while the Lease still shows the holder, the background job and the probe
// must already be dead; the release comes only after the test reaps the
// probe.
func TestKubectlLockRunReapsLeftoversBeforeRelease(t *testing.T) {
	for _, tc := range []struct {
		name      string
		interrupt bool
		code      int
	}{
		{name: "command exits", code: 0},
		{name: "SIGINT", interrupt: true, code: 128 + int(syscall.SIGINT)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := newNamespace(t)
			createReadyLock(t, testutil.MakeLock("billing", ns).Obj())
			g := NewWithT(t)
			dir := t.TempDir()
			shPid, bgPid, goFile := filepath.Join(dir, "sh"), filepath.Join(dir, "bg"), filepath.Join(dir, "go")
			// Exits once $2 exists (at most 30s), or sleeps until SIGINT.
			script := `echo $$ > "$0"; sleep 33 & echo $! > "$1"; echo ready; i=0; until [ -e "$2" ] || [ $i -gt 600 ]; do i=$((i+1)); sleep 0.05; done`
			if tc.interrupt {
				script = `echo $$ > "$0"; sleep 33 & echo $! > "$1"; echo ready; sleep 30`
			}
			cmd := pluginCommand(t, ns, "run", "billing", "--identity", "runner", "--", "sh", "-c", script, shPid, bgPid, goFile)
			out := outputFile(t)
			cmd.Stdout, cmd.Stderr = out.f, out.f
			g.Expect(cmd.Start()).To(Succeed())
			exited := make(chan int, 1)
			go func() { exited <- exitCode(t, cmd.Wait()) }()
			eventually(t, 10*time.Second, func(g Gomega) { g.Expect(out.String()).To(ContainSubstring("ready")) })
			bg := readPid(g, bgPid)

			probe := exec.Command("sleep", "1000")
			probe.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: processGroupOf(g, readPid(g, shPid))}
			g.Expect(probe.Start()).To(Succeed())
			reaped := false
			defer func() {
				if !reaped {
					_ = probe.Process.Kill()
					_ = probe.Wait()
				}
			}()
			if tc.interrupt {
				g.Expect(cmd.Process.Signal(syscall.SIGINT)).To(Succeed())
			} else {
				appendLine(goFile, "")
			}
			eventually(t, 10*time.Second, func(g Gomega) {
				g.Expect(processDead(bg)).To(BeTrue(), "the background job of the command")
				g.Expect(processDead(probe.Process.Pid)).To(BeTrue(), "the probe in the command's group")
			})
			g.Expect(ptr.Deref(getLease(g, ns, "billing").Spec.HolderIdentity, "")).To(Equal("runner"),
				"released while a process of the group was not reaped yet")
			g.Expect(exited).NotTo(Receive(), "kubectl dlock run exited before the group was gone")

			_ = probe.Wait()
			reaped = true
			g.Eventually(exited).WithTimeout(10*time.Second).Should(Receive(Equal(tc.code)), out.String())
			g.Expect(getLease(g, ns, "billing").Spec.HolderIdentity).To(BeNil(), "released once the group was gone")
			g.Expect(processDead(bg)).To(BeTrue())
		})
	}
}

// kill -9 of kubectl dlock run: the watchdog leading the command's group
// SIGKILLs it, a background child of the command included, long before
// the lease could lapse.
func TestKubectlLockRunCommandDiesWithThePlugin(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(3).Obj())
	g := NewWithT(t)
	dir := t.TempDir()
	shPid, bgPid := filepath.Join(dir, "sh"), filepath.Join(dir, "bg")
	cmd := pluginCommand(t, ns, "run", "billing", "--identity", "doomed", "--",
		"sh", "-c", `echo $$ > "$0"; sleep 1000 & echo $! > "$1"; echo ready; while :; do sleep 0.05; done`, shPid, bgPid)
	out := outputFile(t)
	cmd.Stdout, cmd.Stderr = out.f, out.f
	g.Expect(cmd.Start()).To(Succeed())
	eventually(t, 10*time.Second, func(g Gomega) { g.Expect(out.String()).To(ContainSubstring("ready")) })
	pids := []int{readPid(g, shPid), readPid(g, bgPid)}

	g.Expect(cmd.Process.Kill()).To(Succeed())
	killed := time.Now()
	_ = cmd.Wait()
	// The last renewal started at most a renew interval (1s) and its
	// latency before the kill, so the lease cannot lapse for anyone else
	// within lease - 1.5 renew intervals of it.
	bound := 1500 * time.Millisecond
	for _, pid := range pids {
		for !processDead(pid) {
			g.Expect(time.Since(killed)).To(BeNumerically("<", bound), "process %d of the command is alive after the plugin was SIGKILLed", pid)
			time.Sleep(time.Millisecond) // polling interval
		}
	}
	t.Logf("the command and its background child were dead %s after kubectl dlock run was SIGKILLed", time.Since(killed).Round(100*time.Microsecond))
}

// Renewals cut off by a proxy while kubectl dlock run keeps running, and a
// command that ignores SIGTERM and appends to a ledger in a loop: it is
// SIGKILLed before the lease can lapse, so the next holder's command, which
// appends its own line when it starts, comes after the old command's last
// write in the ledger (one file, O_APPEND: the order of its lines is the
// order of the writes).
func TestKubectlLockRunCutOffKillsCommandBeforeNextHolder(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(3).Obj())
	g := NewWithT(t)
	dir := t.TempDir()
	proxy, proxied, err := harness.ProxiedKubeconfig(kubeconfigPath, dir, "old")
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(proxy.Close)
	ledger := filepath.Join(dir, "ledger")

	old := exec.Command(kubectlLock(t), "--kubeconfig", proxied, "-n", ns, "run", "billing", "--identity", "old", "--",
		"sh", "-c", `trap '' TERM; while :; do echo "old $FENCING_TOKEN $(date +%s%N)" >> "$0"; sleep 0.01; done`, ledger)
	oldOut := outputFile(t)
	old.Stdout, old.Stderr = oldOut.f, oldOut.f
	g.Expect(old.Start()).To(Succeed())
	t.Cleanup(func() { _ = old.Process.Kill() })
	eventually(t, 10*time.Second, func(g Gomega) { g.Expect(readLedger(g, ledger)).NotTo(BeEmpty()) })

	appendLine(ledger, fmt.Sprintf("cut 0 %d", time.Now().UnixNano()))
	proxy.Fail(harness.Blackhole)
	next := runPlugin(t, ns, "run", "billing", "--identity", "next", "--wait", "30s", "--",
		"sh", "-c", `echo "new $FENCING_TOKEN $(date +%s%N)" >> "$0"`, ledger)
	g.Expect(next.code).To(Equal(0), next.stderr)
	g.Expect(exitCode(t, old.Wait())).To(Equal(cli.ExitLeaseLost), oldOut.String())

	lines := readLedger(g, ledger)
	var cutAt, lastOld, newAt int
	for i, l := range lines {
		switch l.who {
		case "cut":
			cutAt = i
		case "old":
			lastOld = i
		case "new":
			newAt = i
		}
	}
	g.Expect(newAt).To(Equal(len(lines)-1), "a write of the old holder's command came after the next holder's command started")
	g.Expect(lastOld).To(BeNumerically(">", cutAt), "the old command went on writing after the cut (it ignores SIGTERM)")
	g.Expect(lines[newAt].token).To(BeNumerically(">", lines[lastOld].token))
	g.Expect(oldOut.String()).To(MatchRegexp(`SIGTERM to sh's process group; SIGKILL in \S+ \(--grace 1\.26s\)`), "--grace auto for a 3s lease")
	g.Expect(oldOut.String()).To(ContainSubstring("SIGKILL to sh's process group, before the lease could lapse"))
	t.Logf("after the cut the old command (token %d) wrote %d lines; its last write was %s before the next holder's command (token %d) started",
		lines[lastOld].token, lastOld-cutAt, time.Duration(lines[newAt].at-lines[lastOld].at).Round(time.Millisecond), lines[newAt].token)
}

// ledgerLine is a line "who token unixnano" of a ledger file.
type ledgerLine struct {
	who   string
	token int64
	at    int64
}

func readLedger(g Gomega, path string) []ledgerLine {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	g.Expect(err).NotTo(HaveOccurred())
	var lines []ledgerLine
	for l := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(l)
		g.Expect(f).To(HaveLen(3), "ledger line %q", l)
		token, err := strconv.ParseInt(f[1], 10, 64)
		g.Expect(err).NotTo(HaveOccurred())
		at, err := strconv.ParseInt(f[2], 10, 64)
		g.Expect(err).NotTo(HaveOccurred())
		lines = append(lines, ledgerLine{who: f[0], token: token, at: at})
	}
	return lines
}

// What is checked before acquiring fails without writing the Lease: a
// --grace that does not fit the lease, a command that is not found (127)
// or cannot be executed (126), as a shell would say.
func TestKubectlLockRunRefusesBeforeAcquiring(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(3).Obj())
	g := NewWithT(t)
	before := getLease(g, ns, "billing").Spec

	r := runPlugin(t, ns, "run", "billing", "--grace", "2s", "--", "true")
	g.Expect(r.code).To(Equal(1))
	g.Expect(r.stderr).To(ContainSubstring("--grace 2s does not fit the lease of " + ns + "/billing (leaseDurationSeconds: 3): at most 1.26s does"))
	r = runPlugin(t, ns, "run", "billing", "--grace", "soon", "--", "true")
	g.Expect(r.code).To(Equal(1))
	g.Expect(r.stderr).To(ContainSubstring(`invalid argument "soon" for "--grace" flag`))

	notExecutable := filepath.Join(t.TempDir(), "job.sh")
	g.Expect(os.WriteFile(notExecutable, []byte("#!/bin/sh\necho should not run\n"), 0o644)).To(Succeed())
	for _, tc := range []struct {
		command string
		code    int
		says    string
	}{
		{command: "/no/such/command", code: cli.ExitCommandNotFound, says: "/no/such/command: command not found (nothing acquired)"},
		{command: "no-such-command-in-path", code: cli.ExitCommandNotFound, says: "no-such-command-in-path: command not found"},
		{command: notExecutable, code: cli.ExitCommandNotExecutable, says: notExecutable + ": cannot execute: permission denied"},
		{command: filepath.Dir(notExecutable), code: cli.ExitCommandNotExecutable, says: "cannot execute: is a directory"},
	} {
		r := runPlugin(t, ns, "run", "billing", "--", tc.command)
		g.Expect(r.code).To(Equal(tc.code), "%s: %s", tc.command, r.stderr)
		g.Expect(r.stderr).To(ContainSubstring(tc.says))
		g.Expect(r.stdout).To(BeEmpty())
	}
	g.Expect(getLease(g, ns, "billing").Spec).To(Equal(before), "nothing acquired: no token used up")

	r = runPlugin(t, ns, "run", "billing", "--grace", "1.26s", "--", "sh", "-c", `echo "token $FENCING_TOKEN"`)
	g.Expect(r.code).To(Equal(0), r.stderr)
	g.Expect(r.stdout).To(Equal("token 1\n"), "the largest grace that fits is accepted; the refusals used no token")
}

// A signal that ends the wait for a held lock exits 128+signal, acquires
// nothing and runs nothing.
func TestKubectlLockRunSignalWhileWaiting(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).Obj())
	g := NewWithT(t)
	held, err := newLockClient(t, ns, "billing", "other").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = held.Release(context.Background()) }()

	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		cmd := pluginCommand(t, ns, "run", "billing", "--identity", "waiter", "--wait", "1m", "--", "echo", "should not run")
		out := outputFile(t)
		cmd.Stdout, cmd.Stderr = out.f, out.f
		g.Expect(cmd.Start()).To(Succeed())
		eventually(t, 10*time.Second, func(g Gomega) {
			g.Expect(out.String()).To(ContainSubstring("is held by other (fencing token 1)"))
			g.Expect(out.String()).To(ContainSubstring("; waiting up to 1m0s"))
		})
		g.Expect(cmd.Process.Signal(sig)).To(Succeed())
		g.Expect(exitCode(t, cmd.Wait())).To(Equal(128+int(sig)), out.String())
		g.Expect(out.String()).To(MatchRegexp(`error: SIG(TERM|INT) while acquiring ` + ns + `/billing: nothing run`))
		g.Expect(out.String()).NotTo(ContainSubstring("should not run"))
	}
	g.Expect(ptr.Deref(getLease(g, ns, "billing").Spec.HolderIdentity, "")).To(Equal("other"))
}
