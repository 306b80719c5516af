package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/localrun"
)

// AdmissionOptions size the measurement of lock-admitted pods.
type AdmissionOptions struct {
	// AssetsDir holds kube-apiserver, etcd and kubectl.
	AssetsDir string
	// Waiting are the numbers of gated pods kept waiting behind the holder.
	Waiting []int
	// Admissions is the number of admissions measured per waiting count.
	Admissions int
	// LeaseDurationSeconds of the locks.
	LeaseDurationSeconds int32
}

// AdmissionRow is one waiting count: the latency from the holder pod's
// Succeeded (the status write, as its kubelet makes it) to the next pod's
// gate removal as a watch sees it, and the apiserver writes per admission
// (apiserver_request_total): Lease writes, pod writes other than the
// bench's own (the controller's gate removal and marks), lock status writes.
type AdmissionRow struct {
	Waiting                              int
	Latency                              Row
	LeaseWrites, PodWrites, StatusWrites float64
}

// RunAdmission starts a local control plane with the manager and, for each
// waiting count, keeps that many gated pods queued behind an admitted one,
// finishes the holder, and times the next admission; it prints a table.
func RunAdmission(ctx context.Context, opts AdmissionOptions, out io.Writer) ([]AdmissionRow, error) {
	if len(opts.Waiting) == 0 || opts.Admissions < 1 {
		return nil, errors.New("admission: need waiting counts and at least one admission")
	}
	env, err := localrun.StartEnvironment(ctx, localrun.EnvironmentOptions{AssetsDir: opts.AssetsDir, MetricsBindAddress: "0"})
	if err != nil {
		return nil, err
	}
	defer func() { _ = env.Stop() }()
	cs, err := kubernetes.NewForConfig(env.ControlPlane.Config)
	if err != nil {
		return nil, fmt.Errorf("creating client: %w", err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("creating namespace: %w", err)
	}
	if err := letPodsUseLocks(ctx, cs); err != nil {
		return nil, err
	}
	var rows []AdmissionRow
	for _, w := range opts.Waiting {
		name := fmt.Sprintf("admit-%d", w)
		l := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
			Spec: locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: opts.LeaseDurationSeconds}}
		if err := env.Client.Create(ctx, l); err != nil {
			return rows, fmt.Errorf("creating lock %s: %w", name, err)
		}
		if err := env.WaitReady(ctx, namespace, []string{name}); err != nil {
			return rows, err
		}
		r, err := measureAdmissions(ctx, cs, name, w, opts.Admissions)
		if err != nil {
			return rows, err
		}
		rows = append(rows, r)
	}
	printAdmissions(out, rows, opts)
	return rows, nil
}

// admissionRun is the state of one waiting count's measurement.
type admissionRun struct {
	cs      kubernetes.Interface
	lock    string
	created int
	seen    map[string]bool // pods already seen ungated
	events  <-chan watch.Event
}

// measureAdmissions keeps waiting gated pods behind the holder and
// measures n admissions.
func measureAdmissions(ctx context.Context, cs kubernetes.Interface, lockName string, waiting, n int) (AdmissionRow, error) {
	w, err := cs.CoreV1().Pods(namespace).Watch(ctx, metav1.ListOptions{LabelSelector: "bench.frontdesk.dev/lock=" + lockName})
	if err != nil {
		return AdmissionRow{}, fmt.Errorf("watching pods: %w", err)
	}
	defer w.Stop()
	run := &admissionRun{cs: cs, lock: lockName, seen: map[string]bool{}, events: w.ResultChan()}
	for range waiting + 1 {
		if err := run.createPod(ctx); err != nil {
			return AdmissionRow{}, err
		}
	}
	holder, err := run.nextUngated(ctx, 60*time.Second)
	if err != nil {
		return AdmissionRow{}, err
	}
	row := AdmissionRow{Waiting: waiting, Latency: Row{Name: fmt.Sprintf("admission, %d waiting", waiting)}}
	var total usage3
	for range n {
		if err := run.createPod(ctx); err != nil { // waiting stays as it was after this admission
			return row, err
		}
		time.Sleep(200 * time.Millisecond) // the new pod is queued before counting
		before, err := readRequestCounts(ctx, cs)
		if err != nil {
			return row, err
		}
		start := time.Now()
		if err := run.succeed(ctx, holder); err != nil {
			return row, err
		}
		if holder, err = run.nextUngated(ctx, 60*time.Second); err != nil {
			return row, err
		}
		row.Latency.Samples = append(row.Latency.Samples, time.Since(start))
		time.Sleep(300 * time.Millisecond) // the pass's status write and marks land
		after, err := readRequestCounts(ctx, cs)
		if err != nil {
			return row, err
		}
		total = total.add(writesBetween(before, after))
	}
	slices.Sort(row.Latency.Samples)
	row.LeaseWrites, row.PodWrites, row.StatusWrites = total.lease/float64(n), total.pod/float64(n), total.status/float64(n)
	return row, nil
}

// usage3 counts Lease, pod and lock status writes.
type usage3 struct{ lease, pod, status float64 }

func (u usage3) add(o usage3) usage3 {
	return usage3{u.lease + o.lease, u.pod + o.pod, u.status + o.status}
}

// writesBetween counts the successful writes between two snapshots; pod
// writes are the controller's (the bench creates the next pod before counting).
func writesBetween(before, after requestCounts) usage3 {
	var u usage3
	for key, v := range after {
		delta := v - before[key]
		verb, rest, _ := strings.Cut(key, "|")
		resource, rest, _ := strings.Cut(rest, "|")
		subresource, code, _ := strings.Cut(rest, "|")
		if (verb != "PUT" && verb != "PATCH" && verb != "POST") || !strings.HasPrefix(code, "2") {
			continue
		}
		switch {
		case resource == leasesResource:
			u.lease += delta
		case resource == podsResource && subresource == "":
			u.pod += delta
		case resource == "distributedlocks" && subresource == "status":
			u.status += delta
		}
	}
	return u
}

// letPodsUseLocks lets the namespace's default ServiceAccount, which the
// bench's pods run as, use its locks (what frontdesk-lock-user grants): the
// controller admits a pod only if its ServiceAccount may use the lock.
func letPodsUseLocks(ctx context.Context, cs kubernetes.Interface) error {
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "lock-user", Namespace: namespace}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{locksv1alpha1.GroupVersion.Group}, Resources: []string{"distributedlocks"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "watch", "update", "patch"}},
	}}
	if _, err := cs.RbacV1().Roles(namespace).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating the lock-user role: %w", err)
	}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "default-lock-user", Namespace: namespace},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "lock-user"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "default", Namespace: namespace}}}
	if _, err := cs.RbacV1().RoleBindings(namespace).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("binding the lock-user role: %w", err)
	}
	return nil
}

// createPod creates the next gated pod that runs holding the lock.
func (a *admissionRun) createPod(ctx context.Context) error {
	a.created++
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%04d", a.lock, a.created), Namespace: namespace,
			Labels:      map[string]string{locksv1alpha1.ParticipantLabel: "true", "bench.frontdesk.dev/lock": a.lock},
			Annotations: map[string]string{locksv1alpha1.RunsHoldingAnnotation: a.lock}},
		Spec: corev1.PodSpec{SchedulingGates: []corev1.PodSchedulingGate{{Name: locksv1alpha1.AdmissionGate}},
			Containers: []corev1.Container{{Name: "job", Image: "registry.invalid/job:1"}}},
	}
	if _, err := a.cs.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating pod %s: %w", pod.Name, err)
	}
	return nil
}

// succeed reports the pod Succeeded, as its kubelet would: every container
// terminated, exit code 0 (the controller ends the grant at once only on
// that proof).
func (a *admissionRun) succeed(ctx context.Context, name string) error {
	_, err := reportFinished(ctx, a.cs, name, corev1.PodSucceeded,
		corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", FinishedAt: metav1.Now()})
	return err
}

// nextUngated waits until the watch shows a pod, not seen before, without
// its admission gate, and returns its name.
func (a *admissionRun) nextUngated(ctx context.Context, timeout time.Duration) (string, error) {
	deadline := time.After(timeout)
	for {
		select {
		case ev, ok := <-a.events:
			if !ok {
				return "", errors.New("the pod watch ended")
			}
			pod, isPod := ev.Object.(*corev1.Pod)
			if !isPod || a.seen[pod.Name] || slices.ContainsFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool {
				return g.Name == locksv1alpha1.AdmissionGate
			}) {
				continue
			}
			a.seen[pod.Name] = true
			return pod.Name, nil
		case <-deadline:
			return "", fmt.Errorf("no pod of lock %s was admitted within %s", a.lock, timeout)
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

// printAdmissions prints the admission table.
func printAdmissions(out io.Writer, rows []AdmissionRow, opts AdmissionOptions) {
	fmt.Fprintf(out, "\nLock-admitted pods: from the holder pod's Succeeded to the next pod's gate removal "+
		"(%d admissions per row, lease %ds); apiserver writes per admission\n", opts.Admissions, opts.LeaseDurationSeconds)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "gated pods waiting\tp50\tp90\tp99\tmax\tLease writes\tpod writes\tstatus writes\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%.2f\t%.2f\t%.2f\t\n", r.Waiting, ms(r.Latency.Percentile(50)), ms(r.Latency.Percentile(90)),
			ms(r.Latency.Percentile(99)), ms(r.Latency.Percentile(100)), r.LeaseWrites, r.PodWrites, r.StatusWrites)
	}
	tw.Flush()
}
