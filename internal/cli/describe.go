package cli

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

// describeEvents is how many recent events describe shows.
const describeEvents = 10

func newDescribeCommand(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "describe NAME",
		Short: "Show a lock's holder, fencing token, expiry, waiters, conditions and recent events",
		Long: `Show a lock: holder, fencing token and times from its Lease (the source of
truth), the controller's view from the lock's status (whether the grant is
live, when it lapses as observed on the controller's clock), what is wrong
when the two disagree, the waiters queued on the Lease in the order they get
the lock, the lock's conditions, and its recent events (of this lock only: a
lock deleted and created again under the same name does not show its
predecessor's history).

Each waiter shows its identity, the principal that queued it, its priority
and its seq (the order within a priority). A place in the queue records no
time, so when a waiter started waiting is not known, except for a
lock-admitted pod (a gated pod, queued by the frontdesk controller): its
pod and the pod's creation time are shown (reading them needs get on pods;
without it they are shown as unknown).`,
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
			var shown eventList
			switch {
			case apierrors.IsForbidden(err):
				// frontdesk-lock-user lists no events; frontdesk-lock-admin does.
				shown.withheld = fmt.Sprintf("<not shown: listing the events of namespace %s needs list on events (ClusterRole %s)>",
					v.lock.Namespace, lockAdminRole)
			case err != nil:
				return fmt.Errorf("listing events of %s/%s: %w", v.lock.Namespace, v.lock.Name, err)
			default:
				shown.items = events.Items
			}
			q := readQueue(cmd.Context(), cs, v)
			return describe(o.streams.Out, v, q, shown, time.Now())
		},
	}
}

// eventList is the lock's events describe shows, or why they are withheld.
type eventList struct {
	items    []corev1.Event
	withheld string
}

// describe prints a lock as the describe verb shows it. Every string from
// the cluster goes through printable: a line break or an escape sequence in
// an identity, a message or a reason would forge lines.
func describe(out io.Writer, v *lockView, q queueView, shown eventList, now time.Time) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	describeLease(w, v)
	describeStatus(w, v.lock)
	if err := w.Flush(); err != nil {
		return err
	}
	if err := describeQueue(out, q, now); err != nil {
		return err
	}
	if err := describeConditions(out, v.lock.Status.Conditions); err != nil {
		return err
	}
	return describeEventList(out, shown, now)
}

// describeLease writes the lock's identity and the grant as the Lease shows
// it (or, when the Lease cannot be used, as the controller's status does) to
// w, whose caller flushes it.
func describeLease(w io.Writer, v *lockView) {
	l := v.lock
	fmt.Fprintf(w, "Name:\t%s\n", printable(l.Name))
	fmt.Fprintf(w, "Namespace:\t%s\n", printable(l.Namespace))
	fmt.Fprintf(w, "UID:\t%s\n", printable(string(l.UID)))
	fmt.Fprintf(w, "Lease:\t%s\n", printable(v.leaseName))
	source := "from the Lease"
	if !v.leaseUsable() {
		source = "from the controller's status: the Lease cannot be used"
	}
	fmt.Fprintf(w, "Holder:\t%s (%s)\n", printable(orNone(v.holder())), source)
	if pod, uid, ok := v.admittedPod(); ok {
		fmt.Fprintf(w, "  \t%s\n", admittedPodNote(pod, uid, v.lock.Namespace))
	}
	fmt.Fprintf(w, "Fencing token:\t%d (%s)\n", v.token(), source)
	if v.leaseUsable() {
		if t := v.lease.Spec.AcquireTime; t != nil {
			fmt.Fprintf(w, "Acquired:\t%s (as written by the holder, on its clock)\n", t.UTC().Format(time.RFC3339))
		}
		if t := v.lease.Spec.RenewTime; t != nil {
			fmt.Fprintf(w, "Renewed:\t%s (as written by the holder, on its clock)\n", t.UTC().Format(time.RFC3339))
		}
	}
	fmt.Fprintf(w, "Held:\t%s\n", printable(v.held()))
	fmt.Fprintf(w, "Lease duration:\t%ds: a holder that stops renewing lapses this long after its last renewal, as timed by whoever watches the Lease\n", v.duration())
	if v.leaseUsable() && !v.inSync() && v.leaseHolder() != "" {
		fmt.Fprintf(w, "  \tthe controller has not observed this grant yet, so whether it is still live is unknown here\n")
	}
	fmt.Fprintf(w, "Status:\t%s\n", v.state())
	if p := v.problem(); p != "" {
		fmt.Fprintf(w, "  \t%s\n", printable(p))
	}
}

// describeStatus writes the lock's status, the controller's view, to w,
// whose caller flushes it.
func describeStatus(w io.Writer, l *locksv1alpha1.DistributedLock) {
	st := &l.Status
	fmt.Fprintln(w, "Controller's status:")
	fmt.Fprintf(w, "  Holder:\t%s\n", printable(orNone(st.Holder)))
	fmt.Fprintf(w, "  Fencing token:\t%d\n", st.FencingToken)
	fmt.Fprintf(w, "  Held:\t%s\n", printable(conditionStatus(l, locksv1alpha1.ConditionHeld)))
	if st.HolderPod != "" {
		fmt.Fprintf(w, "  Holder pod:\t%s\n", printable(st.HolderPod))
	}
	if st.GatedPods > 0 {
		fmt.Fprintf(w, "  Gated pods:\t%d (oldest: %s)\n", st.GatedPods, printable(orNone(st.OldestGatedPod)))
	}
	fmt.Fprintf(w, "  Observed generation:\t%d (generation %d)\n", st.ObservedGeneration, l.Generation)
}

// describeConditions prints the lock's conditions, one a line, or <none>.
func describeConditions(out io.Writer, conditions []metav1.Condition) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "Conditions:")
	if len(conditions) == 0 {
		fmt.Fprintln(w, "  <none>")
	}
	for _, c := range conditions {
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\n", printable(c.Type), printable(string(c.Status)), printable(c.Reason), printable(c.Message))
	}
	return w.Flush()
}

// describeEventList prints the last describeEvents of shown's events,
// oldest first, or why they are withheld, or <none>. It sorts shown.items
// in place.
func describeEventList(out io.Writer, shown eventList, now time.Time) error {
	events := shown.items
	slices.SortFunc(events, func(a, b corev1.Event) int { return eventTime(&a).Compare(eventTime(&b)) })
	if len(events) > describeEvents {
		events = events[len(events)-describeEvents:]
	}
	fmt.Fprintln(out, "Events:")
	if shown.withheld != "" {
		fmt.Fprintln(out, "  "+shown.withheld)
		return nil
	}
	if len(events) == 0 {
		fmt.Fprintln(out, "  <none>")
		return nil
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "  TYPE\tREASON\tAGE\tMESSAGE")
	for i := range events {
		ev := &events[i]
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\n", printable(ev.Type), printable(ev.Reason),
			relative(&metav1.Time{Time: eventTime(ev)}, now), printable(ev.Message))
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
