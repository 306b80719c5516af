package cli

import (
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

// describeEvents is how many recent events describe shows.
const describeEvents = 10

func newDescribeCommand(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "describe NAME",
		Short: "Show a lock's holder, fencing token, expiry, conditions and recent events",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			obj, err := o.fetch(cmd.Context(), args)
			if err != nil {
				return err
			}
			locks, err := toLocks(obj)
			if err != nil {
				return err
			}
			cs, _, err := o.clients()
			if err != nil {
				return err
			}
			l := &locks[0]
			events, err := cs.CoreV1().Events(l.Namespace).List(cmd.Context(), metav1.ListOptions{
				FieldSelector: fields.Set{"involvedObject.name": l.Name, "involvedObject.kind": "DistributedLock"}.String(),
			})
			if err != nil {
				return fmt.Errorf("listing events of %s/%s: %w", l.Namespace, l.Name, err)
			}
			return describe(o.streams.Out, l, events.Items, time.Now())
		},
	}
}

func describe(out io.Writer, l *locksv1alpha1.DistributedLock, events []corev1.Event, now time.Time) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "Name:\t%s\n", l.Name)
	fmt.Fprintf(w, "Namespace:\t%s\n", l.Namespace)
	fmt.Fprintf(w, "Lease:\t%s\n", orNone(l.Status.LeaseName))
	fmt.Fprintf(w, "Lease duration:\t%ds\n", l.EffectiveLeaseDurationSeconds())
	fmt.Fprintf(w, "Holder:\t%s\n", orNone(l.Status.Holder))
	fmt.Fprintf(w, "Fencing token:\t%d\n", l.Status.FencingToken)
	fmt.Fprintf(w, "Held:\t%s\n", conditionStatus(l, locksv1alpha1.ConditionHeld))
	if l.Status.AcquireTime != nil {
		fmt.Fprintf(w, "Acquired:\t%s (holder's clock)\n", l.Status.AcquireTime.UTC().Format(time.RFC3339))
	}
	if l.Status.RenewTime != nil {
		fmt.Fprintf(w, "Renewed:\t%s (holder's clock)\n", l.Status.RenewTime.UTC().Format(time.RFC3339))
	}
	fmt.Fprintf(w, "Expires:\t%s (as observed by the controller)\n", relative(l.Status.ExpireTime, now))
	fmt.Fprintln(w, "Conditions:")
	for _, c := range l.Status.Conditions {
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\n", c.Type, c.Status, c.Reason, c.Message)
	}
	if err := w.Flush(); err != nil {
		return err
	}

	sort.Slice(events, func(i, j int) bool { return eventTime(&events[i]).Before(eventTime(&events[j])) })
	if len(events) > describeEvents {
		events = events[len(events)-describeEvents:]
	}
	fmt.Fprintln(out, "Events:")
	if len(events) == 0 {
		fmt.Fprintln(out, "  <none>")
		return nil
	}
	w = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "  TYPE\tREASON\tAGE\tMESSAGE")
	for i := range events {
		ev := &events[i]
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\n", ev.Type, ev.Reason, relative(&metav1.Time{Time: eventTime(ev)}, now), ev.Message)
	}
	return w.Flush()
}

// eventTime is when an event last happened, whichever API wrote it.
func eventTime(ev *corev1.Event) time.Time {
	switch {
	case ev.Series != nil:
		return ev.Series.LastObservedTime.Time
	case !ev.LastTimestamp.IsZero():
		return ev.LastTimestamp.Time
	default:
		return ev.EventTime.Time
	}
}
