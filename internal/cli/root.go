// Package cli implements the `kubectl dlock` plugin: inspect, acquire,
// release and break DistributedLocks, and run a command while holding one.
package cli

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// ExitLeaseLost is the exit status of `kubectl dlock run` when the lease was
// lost while the command ran (EX_TEMPFAIL: retrying may succeed).
const ExitLeaseLost = 75

// ExitError carries a specific exit status out of a command.
type ExitError struct {
	// Code is the process exit status.
	Code int
	// Err, if set, is printed before exiting.
	Err error
}

// Error implements error.
func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return e.Err.Error()
}

// Unwrap returns the wrapped error.
func (e *ExitError) Unwrap() error { return e.Err }

// options are shared by all subcommands.
type options struct {
	config  *genericclioptions.ConfigFlags
	streams genericiooptions.IOStreams
}

// NewCommand builds the `kubectl dlock` command tree.
func NewCommand(streams genericiooptions.IOStreams) *cobra.Command {
	root, _ := newCommand(streams)
	return root
}

// newCommand builds the command tree and the options its commands share.
func newCommand(streams genericiooptions.IOStreams) (*cobra.Command, *options) {
	o := &options{config: genericclioptions.NewConfigFlags(true), streams: streams}
	root := &cobra.Command{
		// The binary is kubectl-dlock; users type "kubectl dlock", and that is
		// what usage lines and help show.
		Use:         "kubectl-dlock",
		Annotations: map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl dlock"},
		Short:       "Inspect and use frontdesk DistributedLocks",
		Long: `kubectl dlock works with frontdesk DistributedLocks: leases with fencing tokens.

Every grant of a lock carries a fencing token that only goes up. Pass it to the
resources you write, so they can reject a holder that paused past its lease.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		// Its help would name the binary; kubectl completes plugins through
		// a kubectl_complete-lock script that calls __complete, which stays.
		CompletionOptions: cobra.CompletionOptions{HiddenDefaultCmd: true},
	}
	o.config.AddFlags(root.PersistentFlags())
	root.AddCommand(
		newGetCommand(o),
		newDescribeCommand(o),
		newAcquireCommand(o),
		newReleaseCommand(o),
		newBreakCommand(o),
		newRunCommand(o),
	)
	return root, o
}

// Main runs the plugin with args and returns the process exit status.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	cmd, o := newCommand(genericiooptions.IOStreams{In: stdin, Out: stdout, ErrOut: stderr})
	cmd.SetArgs(args)
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	sub, err := cmd.ExecuteC()
	var exit *ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		if exit.Err != nil {
			printError(stderr, exit.Err, sub, o)
		}
		return exit.Code
	default:
		printError(stderr, err, sub, o)
		return 1
	}
}

// printError prints the error a command ended with, escaped (its text
// carries strings from the cluster), and for an RBAC refusal which
// ClusterRole to bind and how.
func printError(stderr io.Writer, err error, sub *cobra.Command, o *options) {
	fmt.Fprintln(stderr, "error:", printable(err.Error()))
	verb := ""
	if sub != nil {
		verb = sub.Name()
	}
	ns, nsErr := o.namespace()
	if nsErr != nil {
		ns = "default"
	}
	if hint := forbiddenHint(err, verb, ns); hint != "" {
		fmt.Fprintln(stderr, printable(hint))
	}
}

// namespace is the namespace from the flags or the kubeconfig context.
func (o *options) namespace() (string, error) {
	ns, _, err := o.config.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return "", fmt.Errorf("reading namespace from kubeconfig: %w", err)
	}
	return ns, nil
}

// clients returns typed and dynamic clients for the configured cluster.
func (o *options) clients() (kubernetes.Interface, dynamic.Interface, error) {
	cfg, err := o.config.ToRESTConfig()
	if err != nil {
		return nil, nil, fmt.Errorf("loading kubeconfig: %w", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("creating client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("creating client: %w", err)
	}
	return cs, dyn, nil
}

// lockClient returns a lock client for name as identity.
func (o *options) lockClient(name, identity string) (*lock.Client, error) {
	return o.lockClientOn(name, identity, nil)
}

// lockClientOn returns a lock client for name as identity on clk (nil: the
// real clock).
func (o *options) lockClientOn(name, identity string, clk clock.WithTickerAndDelayedExecution) (*lock.Client, error) {
	ns, err := o.namespace()
	if err != nil {
		return nil, err
	}
	cs, dyn, err := o.clients()
	if err != nil {
		return nil, err
	}
	if identity == "" {
		identity = defaultIdentity()
	}
	return lock.NewForClients(cs, dyn, lock.Config{Namespace: ns, Name: name, Identity: identity, Clock: clk})
}

// defaultIdentity is the identity used when --identity is not given.
func defaultIdentity() string {
	if id := os.Getenv("LOCK_IDENTITY"); id != "" {
		return id
	}
	return lock.DefaultIdentity()
}
