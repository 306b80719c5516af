package cli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

const (
	// ExitCommandNotExecutable is the exit status of `kubectl dlock run`
	// when the command exists but cannot be executed, as in a shell.
	ExitCommandNotExecutable = 126
	// ExitCommandNotFound is the exit status of `kubectl dlock run` when the
	// command does not exist, as in a shell.
	ExitCommandNotFound = 127
)

// forwardedSignals reach the command as they reach kubectl dlock run.
var forwardedSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

// signalNames names the forwarded signals in messages.
var signalNames = map[syscall.Signal]string{
	syscall.SIGINT: "SIGINT", syscall.SIGTERM: "SIGTERM", syscall.SIGHUP: "SIGHUP",
	syscall.SIGQUIT: "SIGQUIT", syscall.SIGUSR1: "SIGUSR1", syscall.SIGUSR2: "SIGUSR2",
}

// reapTimeout bounds the wait for the command's process group to be gone
// after SIGKILL; a process that outlives it is stuck in the kernel.
const reapTimeout = 10 * time.Second

type runOptions struct {
	identity string
	wait     time.Duration
	grace    graceValue
}

func newRunCommand(o *options) *cobra.Command {
	ro := runOptions{grace: graceValue{auto: true}}
	cmd := &cobra.Command{
		Use:   "run NAME [--wait D] [--grace D|auto] -- COMMAND [ARGS...]",
		Short: "Run a command while holding a lock",
		Long: `Acquire the lock, run COMMAND with FENCING_TOKEN, LOCK_NAME, LOCK_NAMESPACE
and LOCK_HOLDER in its environment, renew the lease while it runs, forward
SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to it, release the lock
when it exits, and exit with its status (128+N if signal N killed it).

COMMAND runs in a process group of its own, and every process in that group is
dead before the lease can lapse for anyone else:

  The grant is safe until the start of its last successful renewal plus the
  lease duration, less a safety margin (2% of the lease + 100ms); renewals
  run every third of the lease. If renewals stop getting through, the group
  gets SIGKILL half that margin before the safe window ends, so that it is
  dead and reaped when the grant ends, and SIGTERM --grace before that
  SIGKILL. Each renewal that gets through moves both later. If the lock is
  taken over or broken, the group gets SIGKILL at once. Either way kubectl
  lock run exits 75 (also when the command exits after that SIGTERM).

  --grace must fit in the lease, so that SIGTERM never comes while renewals
  are healthy: at most the safe window, less half the safety margin, less one
  and a half renew intervals (leaseDurationSeconds 15: 6.9s; 6: 2.67s;
  3: 1.26s). --grace auto, the default, is 10s or that maximum, whichever is
  shorter. A longer --grace is refused before anything is acquired. During
  the grace the command still holds the lock, but renewals are failing:
  write with FENCING_TOKEN, so that the protected resource can reject a
  holder that paused.

  When the command exits (by itself, or on a signal forwarded to it), what is
  left of its process group is SIGKILLed and reaped before the lock is
  released. A watchdog process leads the group and holds a SIGKILL
  deadline of its own, on the boot clock: the end of the safe window, half
  the margin after the SIGKILL above, which kubectl dlock run extends after
  each renewal that gets through. So the group gets SIGKILL in time also if
  kubectl dlock run itself stalls (stopped, starved of CPU, in a debugger);
  and at once if it dies, even by SIGKILL (on Linux the command also has
  SIGKILL as its parent-death signal). If the watchdog dies alone, kubectl
  lock run SIGKILLs the group. Processes that leave the group (setsid,
  setpgid) are out of reach, and a freeze of everything at once (the
  cgroup, the VM, a suspend) stops the watchdog with the command: write
  with FENCING_TOKEN, the backstop for that.

The command cannot read from an interactive terminal (its group is not the
terminal's foreground group).

Exit status: the command's; 75 if the lease was lost or ran out while it ran;
127 if COMMAND is not found and 126 if it cannot be executed (checked as a
shell would, before acquiring); 128+N if signal N ended the wait for the lock
(130 for SIGINT, 143 for SIGTERM); 1 for other errors.`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 1 {
				return fmt.Errorf("usage: kubectl dlock run NAME [flags] -- COMMAND [ARGS...]")
			}
			clk := newBootClock(bootNow)
			c, err := o.lockClientOn(args[0], ro.identity, clk)
			if err != nil {
				return err
			}
			if err := checkIdentity(c.Identity()); err != nil {
				return err
			}
			return runHolding(cmd.Context(), o, c, clk, ro, args[1:])
		},
	}
	cmd.Flags().StringVar(&ro.identity, "identity", "", "Identity to hold the lock as (default: $LOCK_IDENTITY, else pod or host name plus a random suffix).")
	cmd.Flags().DurationVar(&ro.wait, "wait", 0, "How long to wait for a held lock (0: fail at once if held).")
	cmd.Flags().Var(&ro.grace, "grace", `Time between SIGTERM and SIGKILL when renewals fail: a duration, or "auto" (10s, or the most that fits the lock's lease if less; see above).`)
	return cmd
}

// runHolding checks the command and the grace, acquires, runs argv while
// holding the grant, and releases.
func runHolding(ctx context.Context, o *options, c *lock.Client, clk *bootClock, ro runOptions, argv []string) error {
	// Listen first: a signal before the command starts (while waiting for
	// the lock above all) ends kubectl dlock run with 128+signal instead of
	// killing it mid-grant. From here on, the forwarded signals never kill
	// kubectl dlock run itself.
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, forwardedSignals...)
	defer signal.Stop(signals)

	path, err := lookCommand(argv[0])
	if err != nil {
		return err
	}
	lk, err := c.GetLock(ctx)
	if err != nil {
		return err
	}
	duration := time.Duration(lk.EffectiveLeaseDurationSeconds()) * time.Second
	if _, err := ro.grace.resolve(c.TimingFor(duration), c.LockName()); err != nil {
		return err
	}
	g, err := acquireForRun(ctx, o, c, ro.wait, signals)
	if err != nil {
		return err
	}
	// The lock's lease duration may have changed since it was read.
	t := g.Timing()
	grace, err := ro.grace.resolve(t, c.LockName())
	if err != nil {
		grace = maxGrace(t)
		fmt.Fprintf(o.streams.ErrOut, "kubectl-dlock: the lease of %s changed to %s since it was read: --grace clamped to %s\n",
			c.LockName(), t.LeaseDuration, grace.Truncate(10*time.Millisecond))
	}
	return holdWhileRunning(o, c, clk, g, t, grace, path, argv, signals)
}

// lookCommand resolves name as a shell would (a name without a slash is
// looked up in $PATH), before anything is acquired: a missing command exits
// 127, one that cannot be executed 126.
func lookCommand(name string) (string, error) {
	path, err := exec.LookPath(name)
	if err == nil || errors.Is(err, exec.ErrDot) {
		// ErrDot: found through a relative $PATH entry; a shell runs it.
		return path, nil
	}
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
		return "", &ExitError{Code: ExitCommandNotFound, Err: fmt.Errorf("%s: command not found (nothing acquired)", name)}
	}
	cause := err
	if execErr, ok := errors.AsType[*exec.Error](err); ok {
		cause = execErr.Err
	}
	if pathErr, ok := errors.AsType[*fs.PathError](cause); ok {
		cause = pathErr.Err
	}
	return "", &ExitError{Code: ExitCommandNotExecutable, Err: fmt.Errorf("%s: cannot execute: %w (nothing acquired)", name, cause)}
}

// acquireForRun tries once, and waits up to wait (saying so on stderr)
// while the lock is held. A signal ends the attempt: the exit status is
// 128+signal, and a grant that came back meanwhile is released.
func acquireForRun(ctx context.Context, o *options, c *lock.Client, wait time.Duration, signals <-chan os.Signal) (*lock.Grant, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	interrupted := make(chan syscall.Signal, 1)
	stop, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case sig := <-signals:
			interrupted <- sig.(syscall.Signal)
			cancel()
		case <-stop:
		}
	}()
	g, err := c.TryAcquire(ctx)
	if err != nil && wait > 0 && ctx.Err() == nil {
		if errors.Is(err, lock.ErrHeld) {
			fmt.Fprintf(o.streams.ErrOut, "kubectl-dlock: %s; waiting up to %s\n", printable(o.withHolderNote(ctx, c, err).Error()), wait)
		}
		waitCtx, cancelWait := context.WithTimeout(ctx, wait)
		g, err = c.Acquire(waitCtx)
		cancelWait()
		err = o.withHolderNote(ctx, c, err)
	} else if wait <= 0 {
		err = withWaitHint(o.withHolderNote(ctx, c, err))
	}
	close(stop)
	<-watched
	select {
	case sig := <-interrupted:
		if g != nil {
			releaseGrant(o, c, g)
		}
		return nil, &ExitError{Code: 128 + int(sig), Err: fmt.Errorf("%s while acquiring %s: nothing run", signalNames[sig], c.LockName())}
	default:
	}
	return g, err
}

// holdWhileRunning runs the command in a process group of its own while
// the grant is held, and ends the group as the grant's timing says. On
// every path the group is SIGKILLed and reaped before the grant is
// released.
func holdWhileRunning(o *options, c *lock.Client, clk *bootClock, g *lock.Grant, t lock.Timing, grace time.Duration,
	path string, argv []string, signals <-chan os.Signal) error {
	stderr := o.streams.ErrOut
	if err := becomeSubreaper(); err != nil {
		fmt.Fprintf(stderr, "kubectl-dlock: %v: processes the command leaves behind go to init; they are still killed\n", err)
	}
	sent := g.ValidUntil()
	grp, err := startProcessGroup(stderr, watchdogDeadline(clk, sent, t))
	if err != nil {
		releaseGrant(o, c, g)
		return err
	}
	// Released only once the group is gone; a failed reap keeps the lock
	// held until it lapses (kubectl dlock run exits, renewals stop).
	finish := func(result error) error {
		if err := grp.reap(reapTimeout); err != nil {
			return fmt.Errorf("%w; %s not released: it lapses after its lease", err, c.LockName())
		}
		if grp.expiredAfterReap() && !isExit(result, ExitLeaseLost) {
			result = ranOutError(c, argv)
		}
		if g.Err() == nil {
			releaseGrant(o, c, g)
		}
		return result
	}

	child := exec.Command(path, argv[1:]...)
	child.Args[0] = argv[0]
	child.Stdin, child.Stdout, child.Stderr = o.streams.In, o.streams.Out, o.streams.ErrOut
	child.Env = append(os.Environ(),
		fmt.Sprintf("FENCING_TOKEN=%d", g.Token()),
		"LOCK_NAME="+c.Name(),
		"LOCK_NAMESPACE="+c.Namespace(),
		"LOCK_HOLDER="+g.Holder(),
	)
	select {
	case sig := <-signals:
		return finish(&ExitError{Code: 128 + int(sig.(syscall.Signal)),
			Err: fmt.Errorf("%s before %s started; released %s", signalNames[sig.(syscall.Signal)], argv[0], c.LockName())})
	default:
	}
	exited, err := grp.start(child)
	if err != nil {
		return finish(&ExitError{Code: ExitCommandNotExecutable, Err: fmt.Errorf("starting %s: %w", argv[0], err)})
	}

	w := &commandWatch{c: c, clk: clk, g: g, t: t, grace: grace, grp: grp, name: argv[0], stderr: stderr, sent: sent}
	waitErr := w.wait(exited, signals)
	switch {
	case g.Err() != nil:
		// Lost while the command ran, even if it ended by itself.
		return finish(lostError(c, argv, g.Err()))
	case w.ranOut:
		return finish(ranOutError(c, argv))
	default:
		return finish(exitStatus(waitErr))
	}
}

// releaseGrant releases g, waiting at most until its safe window ends (a
// second at least): after that the lease lapses anyway.
func releaseGrant(o *options, c *lock.Client, g *lock.Grant) {
	deadline := g.ValidUntil()
	if soon := time.Now().Add(time.Second); deadline.Before(soon) {
		deadline = soon
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if err := g.Release(ctx); err != nil && !errors.Is(err, lock.ErrNotHolder) {
		fmt.Fprintf(o.streams.ErrOut, "kubectl-dlock: releasing %s: %s (it lapses after its lease)\n", printable(c.LockName()), printable(err.Error()))
	}
}

// ranOutError is the error of a command that was terminated because the
// grant's deadline passed without a renewal.
func ranOutError(c *lock.Client, argv []string) error {
	return &ExitError{Code: ExitLeaseLost,
		Err: fmt.Errorf("lease on %s ran out while %s ran: renewals did not get through in time, and it was terminated", c.LockName(), argv[0])}
}

// isExit reports whether err is an ExitError with code.
func isExit(err error, code int) bool {
	var exit *ExitError
	return errors.As(err, &exit) && exit.Code == code
}

func lostError(c *lock.Client, argv []string, cause error) error {
	return &ExitError{Code: ExitLeaseLost, Err: fmt.Errorf("lease on %s lost while %s ran: %w", c.LockName(), argv[0], cause)}
}

// exitStatus maps the command's end to ours: its exit code, or 128+signal.
func exitStatus(err error) error {
	if err == nil {
		return nil
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		return fmt.Errorf("waiting for command: %w", err)
	}
	if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return &ExitError{Code: 128 + int(ws.Signal())}
	}
	return &ExitError{Code: exit.ExitCode()}
}
