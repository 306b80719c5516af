package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// forwardedSignals reach the command as they reach kubectl lock run.
var forwardedSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

type runOptions struct {
	identity string
	wait     time.Duration
	grace    time.Duration
}

func newRunCommand(o *options) *cobra.Command {
	ro := runOptions{}
	cmd := &cobra.Command{
		Use:   "run NAME [--wait D] -- COMMAND [ARGS...]",
		Short: "Run a command while holding a lock",
		Long: `Acquire the lock, run COMMAND with FENCING_TOKEN, LOCK_NAME, LOCK_NAMESPACE
and LOCK_HOLDER in its environment, renew the lease while it runs, forward
signals to it, release the lock when it exits, and exit with its status.

If the lease is lost while the command runs (taken over, broken, or not renewed
in time), the command's process group gets SIGTERM, then SIGKILL after --grace,
and kubectl lock run exits with status 75 saying so. During that grace the
command no longer holds the lock: its writes carry a stale FENCING_TOKEN, which
is what the protected resource must reject.

The command runs in its own process group, so that signals and termination
reach every process it starts; it cannot read from an interactive terminal.`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 1 {
				return fmt.Errorf("usage: kubectl lock run NAME [flags] -- COMMAND [ARGS...]")
			}
			c, err := o.lockClient(args[0], ro.identity)
			if err != nil {
				return err
			}
			return runHolding(cmd.Context(), o, c, ro, args[1:])
		},
	}
	cmd.Flags().StringVar(&ro.identity, "identity", "", "Identity to hold the lock as (default: $LOCK_IDENTITY, else pod or host name plus a random suffix).")
	cmd.Flags().DurationVar(&ro.wait, "wait", 0, "How long to wait for a held lock (0: fail at once if held).")
	cmd.Flags().DurationVar(&ro.grace, "grace", 10*time.Second, "How long the command gets after SIGTERM, when the lease is lost, before SIGKILL.")
	return cmd
}

// runHolding acquires, runs argv while holding the grant, and releases.
func runHolding(ctx context.Context, o *options, c *lock.Client, ro runOptions, argv []string) error {
	// Listen before acquiring: a signal while waiting for the lock ends the
	// wait instead of killing the plugin mid-grant.
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, forwardedSignals...)
	defer signal.Stop(signals)
	acquireCtx, cancelAcquire := context.WithCancel(ctx)
	defer cancelAcquire()
	go func() {
		select {
		case <-signals:
			cancelAcquire()
		case <-acquireCtx.Done():
		}
	}()
	g, err := acquire(acquireCtx, c, ro.wait)
	cancelAcquire()
	if err != nil {
		return err
	}

	child := exec.Command(argv[0], argv[1:]...)
	child.Stdin, child.Stdout, child.Stderr = o.streams.In, o.streams.Out, o.streams.ErrOut
	// Its own process group, so that signals and, when the lease is lost,
	// termination reach every process the command started.
	child.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	child.Env = append(os.Environ(),
		fmt.Sprintf("FENCING_TOKEN=%d", g.Token()),
		"LOCK_NAME="+c.Name(),
		"LOCK_NAMESPACE="+c.Namespace(),
		"LOCK_HOLDER="+g.Holder(),
	)
	if err := child.Start(); err != nil {
		_ = g.Release(context.Background())
		return fmt.Errorf("starting %s: %w", argv[0], err)
	}
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()

	for {
		select {
		case sig := <-signals:
			signalGroup(child, sig.(syscall.Signal))
		case err := <-exited:
			if g.Err() != nil {
				// The command ended, but the lease was lost while it ran:
				// say so rather than report success.
				return lostError(c, argv, g.Err())
			}
			relErr := g.Release(context.Background())
			if relErr != nil && !errors.Is(relErr, lock.ErrNotHolder) {
				fmt.Fprintf(o.streams.ErrOut, "kubectl-lock: releasing %s: %v\n", c.LockName(), relErr)
			}
			return exitStatus(err)
		case <-g.Lost():
			fmt.Fprintf(o.streams.ErrOut, "kubectl-lock: lease on %s lost (%v); terminating %s\n", c.LockName(), g.Err(), argv[0])
			terminate(child, exited, ro.grace)
			return lostError(c, argv, g.Err())
		}
	}
}

func lostError(c *lock.Client, argv []string, cause error) error {
	return &ExitError{Code: ExitLeaseLost, Err: fmt.Errorf("lease on %s lost while %s ran: %w", c.LockName(), argv[0], cause)}
}

// terminate sends SIGTERM to the command's process group, then SIGKILL
// after grace, and waits for the command to exit; processes it left behind
// in its group are killed too. The command may run up to grace after the
// lease is lost: whatever it writes then carries a stale fencing token, for
// the resource to reject.
func terminate(child *exec.Cmd, exited <-chan error, grace time.Duration) {
	signalGroup(child, syscall.SIGTERM)
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-exited:
		signalGroup(child, syscall.SIGKILL) // stragglers the command left behind
	case <-timer.C:
		signalGroup(child, syscall.SIGKILL)
		<-exited
	}
}

// signalGroup signals every process in the command's process group.
func signalGroup(child *exec.Cmd, sig syscall.Signal) {
	_ = syscall.Kill(-child.Process.Pid, sig)
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
