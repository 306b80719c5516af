package cli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/cli-runtime/pkg/printers"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

var distributedLocks = locksv1alpha1.GroupVersion.WithResource("distributedlocks")

func newGetCommand(o *options) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "get [NAME]",
		Short: "List locks, or show one, with holder, fencing token and expiry",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			obj, err := o.fetch(cmd.Context(), args)
			if err != nil {
				return err
			}
			return printObject(o.streams.Out, obj, output)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "Output format: json, yaml or wide (default: a table).")
	return cmd
}

// fetch reads one lock (args[0]) or all locks in the namespace.
func (o *options) fetch(ctx context.Context, args []string) (runtime.Object, error) {
	ns, err := o.namespace()
	if err != nil {
		return nil, err
	}
	_, dyn, err := o.clients()
	if err != nil {
		return nil, err
	}
	res := dyn.Resource(distributedLocks).Namespace(ns)
	if len(args) == 1 {
		obj, err := res.Get(ctx, args[0], metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("getting distributedlock %s/%s: %w", ns, args[0], err)
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
func printObject(out io.Writer, obj runtime.Object, output string) error {
	switch output {
	case "json":
		return (&printers.JSONPrinter{}).PrintObj(obj, out)
	case "yaml":
		return (&printers.YAMLPrinter{}).PrintObj(obj, out)
	case "", "wide":
		locks, err := toLocks(obj)
		if err != nil {
			return err
		}
		return printTable(out, locks, output == "wide")
	default:
		return fmt.Errorf("unknown output format %q: use json, yaml or wide", output)
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

func printTable(out io.Writer, locks []locksv1alpha1.DistributedLock, wide bool) error {
	w := tabwriter.NewWriter(out, 0, 4, 3, ' ', 0)
	header := "NAME\tHOLDER\tTOKEN\tHELD\tEXPIRES\tAGE"
	if wide {
		header += "\tLEASE\tDURATION\tREADY"
	}
	fmt.Fprintln(w, header)
	now := time.Now()
	for i := range locks {
		l := &locks[i]
		row := fmt.Sprintf("%s\t%s\t%d\t%s\t%s\t%s", l.Name, orNone(l.Status.Holder), l.Status.FencingToken,
			conditionStatus(l, locksv1alpha1.ConditionHeld), relative(l.Status.ExpireTime, now), age(l.CreationTimestamp, now))
		if wide {
			row += fmt.Sprintf("\t%s\t%ds\t%s", l.Status.LeaseName, l.EffectiveLeaseDurationSeconds(), conditionStatus(l, locksv1alpha1.ConditionReady))
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
