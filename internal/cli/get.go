package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/cli-runtime/pkg/printers"
	"k8s.io/client-go/dynamic"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

var distributedLocks = locksv1alpha1.GroupVersion.WithResource("distributedlocks")

func newGetCommand(o *options) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "get [NAME]",
		Short: "List locks, or show one, with holder, fencing token and expiry",
		Long: `List locks, or show one.

HOLDER and TOKEN come from the lock's Lease, the source of truth (acquire,
renew and release are compare-and-swap writes on it). HELD is the
controller's view from the lock's status: whether it sees the grant live,
judged on its own clock (Expired once it has seen no renewal for the lease
duration). WAITING is how many waiters are queued on the Lease (describe
lists them). DURATION is the lease duration: a holder that stops renewing
lapses that long after its last renewal, as timed by whoever watches the
Lease (renewals are not written to status, so no exact expiry is). STATUS is InSync
when the Lease and the status agree; otherwise it names what is wrong (Stale:
the controller has not recorded the Lease's latest grant or release, which
happens when the frontdesk manager is not running; LeaseMissing,
LeaseNotOwned, LeaseDeleting, LeaseUnreadable, LeaseMalformed), and a warning
on stderr says what to do. While the status is stale, HELD is Unknown:
nobody here has timed the holder's renewals. -o wide adds the Lease, the
Ready condition and the Lease's renewTime as written by the holder, on its
own clock.

-o json|yaml print the DistributedLock objects as stored; warnings still go
to stderr.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output, "json", "yaml", "wide"); err != nil {
				return err
			}
			ns, err := o.namespace()
			if err != nil {
				return err
			}
			obj, views, err := o.readViewsSettled(cmd.Context(), ns, args)
			if err != nil {
				return err
			}
			if len(views) == 0 && (output == "" || output == "wide") {
				fmt.Fprintf(o.streams.ErrOut, "No locks found in namespace %s.\n", printable(ns))
				return nil
			}
			if err := printObject(o.streams.Out, obj, views, output); err != nil {
				return err
			}
			printWarnings(o.streams.ErrOut, views)
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "Output format: json, yaml or wide (default: a table).")
	return cmd
}

// checkOutput fails on an output format not in allowed ("" is the default
// and always allowed). Commands call it before anything else, above all
// before any write.
func checkOutput(output string, allowed ...string) error {
	if output == "" || slices.Contains(allowed, output) {
		return nil
	}
	return fmt.Errorf("unknown output format %q: use %s", output, orList(allowed))
}

// orList renders ["a","b","c"] as "a, b or c".
func orList(items []string) string {
	if len(items) == 1 {
		return items[0]
	}
	return strings.Join(items[:len(items)-1], ", ") + " or " + items[len(items)-1]
}

// fetchLocks reads one lock (names[0]) or all locks in the namespace.
func fetchLocks(ctx context.Context, dyn dynamic.Interface, ns string, names []string) (runtime.Object, error) {
	res := dyn.Resource(distributedLocks).Namespace(ns)
	if len(names) == 1 {
		obj, err := res.Get(ctx, names[0], metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("getting distributedlock %s/%s: %w", ns, names[0], err)
		}
		return obj, nil
	}
	list, err := res.List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing distributedlocks in %s: %w", ns, err)
	}
	return list, nil
}

// printObject prints a lock or list as JSON, YAML or a table.
func printObject(out io.Writer, obj runtime.Object, views []lockView, output string) error {
	switch output {
	case "json":
		return (&printers.JSONPrinter{}).PrintObj(obj, out)
	case "yaml":
		return (&printers.YAMLPrinter{}).PrintObj(obj, out)
	case "", "wide":
		return printTable(out, views, output == "wide")
	default:
		return fmt.Errorf("unknown output format %q: use json, yaml or wide", output)
	}
}

// printWarnings says, one line per lock, what is wrong with its Lease or
// status.
func printWarnings(out io.Writer, views []lockView) {
	for i := range views {
		if p := views[i].problem(); p != "" {
			fmt.Fprintf(out, "warning: lock %s: %s\n", printable(views[i].lock.Name), printable(p))
		}
	}
}

func toLocks(obj runtime.Object) ([]locksv1alpha1.DistributedLock, error) {
	var items []unstructured.Unstructured
	switch o := obj.(type) {
	case *unstructured.Unstructured:
		items = []unstructured.Unstructured{*o}
	case *unstructured.UnstructuredList:
		items = o.Items
	default:
		return nil, fmt.Errorf("unexpected object %T", obj)
	}
	locks := make([]locksv1alpha1.DistributedLock, len(items))
	for i := range items {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(items[i].Object, &locks[i]); err != nil {
			return nil, fmt.Errorf("decoding distributedlock %s: %w", items[i].GetName(), err)
		}
	}
	return locks, nil
}

// printTable prints the views as get's table. Every string from the
// cluster goes through printable: a tab or a line break in a field would
// forge columns or rows.
func printTable(out io.Writer, views []lockView, wide bool) error {
	w := tabwriter.NewWriter(out, 0, 4, 3, ' ', 0)
	header := "NAME\tHOLDER\tTOKEN\tHELD\tWAITING\tDURATION\tSTATUS\tAGE"
	if wide {
		header += "\tLEASE\tREADY\tRENEWED"
	}
	fmt.Fprintln(w, header)
	now := time.Now()
	for i := range views {
		v := &views[i]
		l := v.lock
		row := fmt.Sprintf("%s\t%s\t%d\t%s\t%s\t%ds\t%s\t%s", printable(l.Name), printable(orNone(v.holder())), v.token(),
			printable(v.held()), v.waiting(), v.duration(), v.state(), age(l.CreationTimestamp, now))
		if wide {
			row += fmt.Sprintf("\t%s\t%s\t%s", printable(v.leaseName),
				printable(conditionStatus(l, locksv1alpha1.ConditionReady)), v.renewed())
		}
		fmt.Fprintln(w, row)
	}
	return w.Flush()
}

func conditionStatus(l *locksv1alpha1.DistributedLock, condType string) string {
	c := meta.FindStatusCondition(l.Status.Conditions, condType)
	if c == nil {
		return "Unknown"
	}
	if c.Status == metav1.ConditionFalse && c.Reason != "" {
		return fmt.Sprintf("False (%s)", c.Reason)
	}
	return string(c.Status)
}

// relative renders a time as "in 5s" or "3s ago".
func relative(t *metav1.Time, now time.Time) string {
	if t == nil {
		return "<none>"
	}
	if d := t.Sub(now); d > 0 {
		return "in " + duration.HumanDuration(d)
	}
	return duration.HumanDuration(now.Sub(t.Time)) + " ago"
}

func age(t metav1.Time, now time.Time) string {
	return duration.HumanDuration(now.Sub(t.Time))
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}
