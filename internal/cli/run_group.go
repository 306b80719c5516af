package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"syscall"
	"time"
)

// WatchdogArg is the argument that, as the only one, makes kubectl-dlock the
// watchdog of the command that kubectl dlock run holds a lock for: a program
// that calls Main must call RunWatchdog instead when started with it, as
// cmd/kubectl-dlock does. It is not meant to be typed.
const WatchdogArg = "__run-watchdog"

// watchdogReady is what the watchdog writes once it ignores signals and
// holds its first deadline; watchdogExpired what it writes when that
// deadline passed without extension, just before it SIGKILLs the group.
const (
	watchdogReady   = "ok\n"
	watchdogExpired = "expired\n"
)

// processGroup is the process group a command runs in. Its leader is a
// watchdog process (this binary again, in WatchdogArg mode) that holds the
// read end of a pipe whose write end only kubectl dlock run holds. Over it,
// kubectl dlock run sends deadlines (see extend); the watchdog SIGKILLs the
// whole group, itself included, when the latest deadline passes, and when
// the pipe closes because kubectl dlock run exited or was killed, even by
// SIGKILL. So a stalled kubectl dlock run (stopped, starved of CPU) cannot
// keep the command running past its deadline. The group ID is the
// watchdog's pid, known before the command starts; and while the watchdog
// is unreaped, that ID cannot be reused.
type processGroup struct {
	pgid     int
	watchdog *os.Process
	// lifeline is the write end of the watchdog's pipe.
	lifeline *os.File
	// expired is closed when the watchdog reports that its deadline
	// passed; gone when its report pipe closes (it died).
	expired, gone chan struct{}
}

// startProcessGroup starts the watchdog with first as its deadline (on the
// deadline clock, bootNow), and waits until it is ready: it leads its own
// group, ignores the signals that are forwarded to the group, and holds the
// deadline. Only then may a command start in the group.
func startProcessGroup(stderr io.Writer, first time.Duration) (*processGroup, error) {
	self, err := selfExecutable()
	if err != nil {
		return nil, fmt.Errorf("starting the watchdog: finding this executable: %w", err)
	}
	lifeR, lifeW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("starting the watchdog: %w", err)
	}
	reportR, reportW, err := os.Pipe()
	if err != nil {
		lifeR.Close()
		lifeW.Close()
		return nil, fmt.Errorf("starting the watchdog: %w", err)
	}
	errFile, _ := stderr.(*os.File)
	p, err := os.StartProcess(self, []string{os.Args[0], WatchdogArg}, &os.ProcAttr{
		Dir:   "/",
		Files: []*os.File{lifeR, reportW, errFile},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	})
	lifeR.Close()
	reportW.Close()
	if err != nil {
		lifeW.Close()
		reportR.Close()
		return nil, fmt.Errorf("starting the watchdog %s: %w", self, err)
	}
	grp := &processGroup{pgid: p.Pid, watchdog: p, lifeline: lifeW, expired: make(chan struct{}), gone: make(chan struct{})}
	if err := grp.awaitReady(reportR, first); err != nil {
		reportR.Close()
		_ = grp.reap(5 * time.Second)
		return nil, fmt.Errorf("starting the watchdog %s: %w", self, err)
	}
	go grp.readReport(reportR)
	return grp, nil
}

// awaitReady sends the watchdog its first deadline and waits for it to
// report ready.
func (grp *processGroup) awaitReady(report *os.File, first time.Duration) error {
	if err := grp.extend(first); err != nil {
		return err
	}
	_ = report.SetReadDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, len(watchdogReady))
	if _, err := io.ReadFull(report, buf); err != nil || string(buf) != watchdogReady {
		return fmt.Errorf("it did not report ready: %v", err) //nolint:errorlint // err is nil when the bytes are wrong; %w would print %!w(<nil>)
	}
	_ = report.SetReadDeadline(time.Time{})
	return nil
}

// readReport closes grp.expired if the watchdog reports its deadline
// passed, and grp.gone once it has died (its report pipe closed).
func (grp *processGroup) readReport(report *os.File) {
	defer close(grp.gone)
	defer report.Close()
	buf := make([]byte, len(watchdogExpired))
	if _, err := io.ReadFull(report, buf); err == nil && string(buf) == watchdogExpired {
		close(grp.expired)
	}
	_, _ = io.Copy(io.Discard, report)
}

// extend sets the watchdog's deadline, on the deadline clock (bootNow).
// Only a deadline strictly before the lease could lapse for anyone else
// may be sent.
func (grp *processGroup) extend(deadline time.Duration) error {
	return writeDeadline(grp.lifeline, deadline)
}

// expiredAfterReap reports whether the watchdog SIGKILLed the group because
// its deadline passed. Call it after reap: the watchdog is dead, so its
// report is complete.
func (grp *processGroup) expiredAfterReap() bool {
	select {
	case <-grp.gone:
	case <-time.After(time.Second):
	}
	select {
	case <-grp.expired:
		return true
	default:
		return false
	}
}

// RunWatchdog is the watchdog's main (see processGroup): it ignores the
// signals kubectl dlock run forwards to the group, reads its first deadline
// from stdin, reports ready on stdout, and then SIGKILLs its process group
// when the latest deadline read from stdin passes (saying so on stdout and
// stderr first) or at EOF on stdin.
func RunWatchdog() int {
	ignored := append([]os.Signal{syscall.SIGPIPE, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU}, forwardedSignals...)
	signal.Ignore(ignored...)
	if syscall.Getpgrp() != os.Getpid() {
		// Run by hand: the group is not ours to kill.
		fmt.Fprintln(os.Stderr, "kubectl-dlock: "+WatchdogArg+" is started by kubectl dlock run as the leader of its command's process group")
		return 2
	}
	// Any read error or malformed deadline closes deadlines, which ends
	// the watch as EOF does.
	deadlines := readDeadlines(os.Stdin)
	first, ok := <-deadlines
	if ok {
		if _, err := os.Stdout.WriteString(watchdogReady); err == nil &&
			awaitDeadline(first, deadlines, bootNow, time.After) {
			_, _ = os.Stdout.WriteString(watchdogExpired)
			fmt.Fprintln(os.Stderr, "kubectl-dlock: kubectl dlock run did not extend the deadline of its command's process group "+
				"(it is stalled, or renewals are not getting through): SIGKILL to the group, before the lease could lapse")
		}
	}
	_ = syscall.Kill(0, syscall.SIGKILL)
	return 1 // not reached: SIGKILL includes this process
}

// start starts cmd in the group, from a goroutine locked to its OS thread
// until cmd is reaped: cmd gets SIGKILL if that thread (Pdeathsig: the
// parent is the forking thread, not the process) or the process dies.
// exited receives what cmd.Wait returns.
func (grp *processGroup) start(cmd *exec.Cmd) (exited <-chan error, err error) {
	cmd.SysProcAttr = groupMemberAttr(grp.pgid)
	started := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		done <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return done, nil
}

// signal sends sig to every process in the group. The watchdog ignores
// all but SIGKILL.
func (grp *processGroup) signal(sig syscall.Signal) {
	_ = syscall.Kill(-grp.pgid, sig)
}

// kill SIGKILLs every process in the group.
func (grp *processGroup) kill() { grp.signal(syscall.SIGKILL) }

// reap SIGKILLs the group and waits, up to timeout, until no process of it
// is left: it reaps those that are this process's children (the watchdog,
// and processes orphaned by the command, which a child subreaper inherits)
// and waits for the others to be reaped by their parents. Call it only
// after the command itself was reaped by its exec.Cmd.Wait: the wait here
// is for any child in the group, and must not take the command's status
// from it.
func (grp *processGroup) reap(timeout time.Duration) error {
	done := make(chan struct{})
	go func() {
		grp.reapAll()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(timeout):
		return fmt.Errorf("processes of group %d are still there %s after SIGKILL", grp.pgid, timeout)
	}
	grp.lifeline.Close()
	_ = grp.watchdog.Release()
	return nil
}

func (grp *processGroup) reapAll() {
	for {
		grp.kill()
		for {
			var ws syscall.WaitStatus
			_, err := syscall.Wait4(-grp.pgid, &ws, 0, nil)
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			if err != nil { // ECHILD: no child of ours is left in the group
				break
			}
		}
		if err := syscall.Kill(-grp.pgid, 0); errors.Is(err, syscall.ESRCH) {
			return
		}
		// A member whose parent is another member, dying of the same
		// SIGKILL (its orphans come to us next), or a process outside the
		// group that will reap it: give them a moment.
		time.Sleep(5 * time.Millisecond)
	}
}
