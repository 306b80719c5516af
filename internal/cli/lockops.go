package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/frontdesk-dev/frontdesk/pkg/lease"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// grantInfo is what acquire prints with -o json|yaml.
type grantInfo struct {
	Lock         string `json:"lock"`
	Holder       string `json:"holder"`
	FencingToken int64  `json:"fencingToken"`
}

func newAcquireCommand(o *options) *cobra.Command {
	var identity, output string
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "acquire NAME",
		Short: "Acquire a lock once and print its fencing token",
		Long: `Acquire a lock and print the fencing token of the grant.

The grant is not renewed after this command exits: it lapses after the lock's
lease duration unless released first with 'kubectl dlock release NAME --identity ID'.
To hold a lock while a command runs, use 'kubectl dlock run'.

Every flag is checked before the lock is taken. If the grant cannot be
printed (stdout closed), it is released again: nobody is left holding a lock
under an identity nobody saw.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output, "json", "yaml"); err != nil {
				return err
			}
			if wait < 0 {
				return fmt.Errorf("--wait %s is negative: give how long to wait for a held lock (0: fail at once if held)", wait)
			}
			c, err := o.lockClient(args[0], identity)
			if err != nil {
				return err
			}
			if err := checkIdentity(c.Identity()); err != nil {
				return err
			}
			// A closed stdout must fail the write below, not kill the
			// process between the grant and its release.
			signal.Ignore(syscall.SIGPIPE)
			g, err := o.acquire(cmd.Context(), c, wait)
			if err != nil {
				return err
			}
			info := grantInfo{Lock: g.Lock(), Holder: g.Holder(), FencingToken: g.Token()}
			if err := printGrant(o.streams.Out, info, output, args[0]); err != nil {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if relErr := g.Release(ctx); relErr != nil {
					return fmt.Errorf("printing the grant of %s failed (%w), and releasing it failed too: %w; it is held by %s with fencing token %d until its lease lapses",
						info.Lock, err, relErr, info.Holder, info.FencingToken)
				}
				return fmt.Errorf("printing the grant of %s failed, so it was released again: %w", info.Lock, err)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&identity, "identity", "", "Identity to hold the lock as (default: $LOCK_IDENTITY, else pod or host name plus a random suffix).")
	cmd.Flags().DurationVar(&wait, "wait", 0, "How long to wait for a held lock (0: fail at once if held).")
	cmd.Flags().StringVarP(&output, "output", "o", "", "Output format: json or yaml.")
	return cmd
}

// printGrant prints what acquire got, in the output format.
func printGrant(out io.Writer, info grantInfo, output, name string) error {
	var b []byte
	switch output {
	case "json":
		var err error
		if b, err = json.Marshal(info); err != nil {
			return err
		}
		b = append(b, '\n')
	case "yaml":
		var err error
		if b, err = yaml.Marshal(info); err != nil {
			return err
		}
	default:
		b = fmt.Appendf(nil, "acquired %s as %s with fencing token %d\n"+
			"the grant is not renewed after this command; release it with: kubectl dlock release %s --identity %s\n",
			printable(info.Lock), printable(info.Holder), info.FencingToken, printable(name), printable(info.Holder))
	}
	_, err := out.Write(b)
	return err
}

// checkIdentity refuses, before anything is written, an identity a new
// grant may not carry (the Lease's grammar, which the lease-guard policy
// enforces too): so the identity the plugin prints and exports as
// $LOCK_HOLDER is printable ASCII as it is.
func checkIdentity(identity string) error {
	if lease.ValidIdentity(identity) {
		return nil
	}
	return fmt.Errorf("identity %q is not of the grammar %s: 1 to %d printable ASCII characters, not starting or ending with a space (nothing acquired)",
		identity, lease.IdentityPattern, lease.MaxIdentityLength)
}

// acquire tries once (wait 0) or waits up to wait for the lock. A lock
// held by a lock-admitted pod is said to be (withHolderNote).
func (o *options) acquire(ctx context.Context, c *lock.Client, wait time.Duration) (*lock.Grant, error) {
	if wait <= 0 {
		g, err := c.TryAcquire(ctx)
		return g, withWaitHint(o.withHolderNote(ctx, c, err))
	}
	waitCtx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	g, err := c.Acquire(waitCtx)
	return g, o.withHolderNote(ctx, c, err)
}

// withWaitHint adds to ErrHeld, from a single try (--wait 0, the
// default), how to wait for the lock instead.
func withWaitHint(err error) error {
	if !errors.Is(err, lock.ErrHeld) {
		return err
	}
	return fmt.Errorf("%w; not waiting (--wait 0, the default): to queue for it, pass --wait with how long, e.g. --wait 5m", err)
}

func newReleaseCommand(o *options) *cobra.Command {
	var identity string
	cmd := &cobra.Command{
		Use:   "release NAME --identity ID",
		Short: "Release a lock if ID still holds it",
		Long: `Release a lock, only if the given identity still holds it (a compare-and-swap on
the Lease). Releasing a lock that someone else holds changes nothing and fails.
The identity is --identity, else $LOCK_IDENTITY (as for acquire and run).

Where the lease-guard policy is installed (config/default), a grant is bound
to the principal that made it (the user, and the pod for a pod's token): only
the same principal releases it, whatever --identity says; ending someone
else's grant is a break (kubectl dlock break), which needs the verb "break" on
the lock (ClusterRole frontdesk-lock-admin).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if identity == "" {
				identity = os.Getenv("LOCK_IDENTITY")
			}
			if identity == "" {
				return fmt.Errorf("--identity is required (or set $LOCK_IDENTITY): give the identity the lock was acquired as; 'kubectl dlock get %s' shows its holder", args[0])
			}
			c, err := o.lockClient(args[0], identity)
			if err != nil {
				return err
			}
			if err := c.Release(cmd.Context()); err != nil {
				return err
			}
			fmt.Fprintf(o.streams.Out, "released %s (was held by %s)\n", printable(c.LockName()), printable(identity))
			return nil
		},
	}
	cmd.Flags().StringVar(&identity, "identity", "", "Identity the lock was acquired as (default: $LOCK_IDENTITY; one of them is required).")
	return cmd
}

func newBreakCommand(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "break NAME",
		Short: "Force-release a lock and bump its fencing token (admin)",
		Long: `Force-release a lock whoever holds it, and bump its fencing token in the same
compare-and-swap, so the previous holder is fenced: its renewals fail, and
resources reject its token once a newer holder writes.

Where the lease-guard policy is installed (config/default), breaking a grant
that is not yours needs the verb "break" on distributedlocks.locks.frontdesk.dev
for the lock: bind the ClusterRole frontdesk-lock-admin to who may break locks.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.lockClient(args[0], "kubectl-dlock-break")
			if err != nil {
				return err
			}
			res, err := c.Break(cmd.Context())
			if err != nil {
				return err
			}
			fmt.Fprintf(o.streams.Out, "broke %s: was held by %s with fencing token %d; fencing token is now %d\n",
				printable(c.LockName()), printable(orNone(res.PreviousHolder)), res.PreviousToken, res.Token)
			return nil
		},
	}
}
