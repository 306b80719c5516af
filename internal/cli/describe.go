package cli

import (
	"fmt"
	"io"
	"slices"
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
		Long: `Show a lock: holder, fencing token and times from its Lease (the source of
truth), the controller's view from the lock's status (whether the grant is
live, when it lapses as observed on the controller's clock), what is wrong
when the two disagree, the lock's conditions, and its recent events (of this
lock only: a lock deleted and created again under the same name does not
show its predecessor's history).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, err := o.namespace()
			if err != nil {
				return err
			}
			_, views, err := o.readViewsSettled(cmd.Context(), ns, args)
			if err != nil {
				return err
			}
			cs, _, err := o.clients()
			if err != nil {
				return err
			}
			v := &views[0]
			events, err := cs.CoreV1().Events(v.lock.Namespace).List(cmd.Context(), metav1.ListOptions{
				FieldSelector: fields.OneTermEqualSelector("involvedObject.uid", string(v.lock.UID)).String(),
			})
			if err != nil {
				return fmt.Errorf("listing events of %s/%s: %w", v.lock.Namespace, v.lock.Name, err)
			}
			return describe(o.streams.Out, v, events.Items, time.Now())
		},
	}
}

func describe(out io.Writer, v *lockView, events []corev1.Event, now time.Time) error {
	l := v.lock
	st := &l.Status
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "Name:\t%s\n", l.Name)
	fmt.Fprintf(w, "Namespace:\t%s\n", l.Namespace)
	fmt.Fprintf(w, "UID:\t%s\n", l.UID)
	fmt.Fprintf(w, "Lease:\t%s\n", v.leaseName)
	source := "from the Lease"
	if !v.leaseUsable() {
		source = "from the controller's status: the Lease cannot be used"
	}
	fmt.Fprintf(w, "Holder:\t%s (%s)\n", orNone(v.holder()), source)
	fmt.Fprintf(w, "Fencing token:\t%d (%s)\n", v.token(), source)
	if v.leaseUsable() {
		if t := v.lease.Spec.AcquireTime; t != nil {
			fmt.Fprintf(w, "Acquired:\t%s (as written by the holder, on its clock)\n", t.UTC().Format(time.RFC3339))
		}
		if t := v.lease.Spec.RenewTime; t != nil {
			fmt.Fprintf(w, "Renewed:\t%s (as written by the holder, on its clock)\n", t.UTC().Format(time.RFC3339))
		}
	}
	fmt.Fprintf(w, "Held:\t%s\n", v.held())
	fmt.Fprintf(w, "Lease duration:\t%ds: a holder that stops renewing lapses this long after its last renewal, as timed by whoever watches the Lease\n", v.duration())
	if v.leaseUsable() && !v.inSync() && v.leaseHolder() != "" {
		fmt.Fprintf(w, "  \tthe controller has not observed this grant yet, so whether it is still live is unknown here\n")
	}
	fmt.Fprintf(w, "Status:\t%s\n", v.state())
	if p := v.problem(); p != "" {
		fmt.Fprintf(w, "  \t%s\n", p)
	}
	fmt.Fprintln(w, "Controller's status:")
	fmt.Fprintf(w, "  Holder:\t%s\n", orNone(st.Holder))
	fmt.Fprintf(w, "  Fencing token:\t%d\n", st.FencingToken)
	fmt.Fprintf(w, "  Held:\t%s\n", conditionStatus(l, locksv1alpha1.ConditionHeld))
	if st.HolderPod != "" {
		fmt.Fprintf(w, "  Holder pod:\t%s\n", st.HolderPod)
	}
	fmt.Fprintf(w, "  Observed generation:\t%d (generation %d)\n", st.ObservedGeneration, l.Generation)
	fmt.Fprintln(w, "Conditions:")
	if len(st.Conditions) == 0 {
		fmt.Fprintln(w, "  <none>")
	}
	for _, c := range st.Conditions {
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\n", c.Type, c.Status, c.Reason, c.Message)
	}
	if err := w.Flush(); err != nil {
		return err
	}

	slices.SortFunc(events, func(a, b corev1.Event) int { return eventTime(&a).Compare(eventTime(&b)) })
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
