package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// WritesRow is what one scenario cost the apiserver, counted by the
// apiserver itself (apiserver_request_total), per grant or per renewal.
type WritesRow struct {
	// Scenario says what was measured.
	Scenario string
	// Per is the unit: "grant" or "renewal".
	Per string
	// N is how many grants or renewals were measured.
	N int
	// LeaseWrites, LeaseConflicts and StatusWrites are per unit: Lease
	// writes that succeeded, Lease writes refused with 409 Conflict, lock
	// status writes.
	LeaseWrites, LeaseConflicts, StatusWrites float64
	// LeaseReads and LockReads are Lease and DistributedLock reads (GET or
	// LIST) per unit; LeaseEvents the Lease watch events the apiserver
	// sent per unit, to every watcher (the waiters', the controller's and
	// the bench's own watch of the queue's order).
	LeaseReads, LockReads, LeaseEvents float64
	// WorstOvertaking is the largest number of waiters that registered
	// after a waiter but were granted the lock before it (-1: not measured).
	WorstOvertaking int
}

// requestCounts is the apiserver's own count of requests by verb,
// resource, subresource and code.
type requestCounts map[string]float64

func countKey(verb, resource, subresource, code string) string {
	return verb + "|" + resource + "|" + subresource + "|" + code
}

// readRequestCounts scrapes apiserver_request_total from the apiserver.
func readRequestCounts(ctx context.Context, cs kubernetes.Interface) (requestCounts, error) {
	counts := requestCounts{}
	err := scrapeCounter(ctx, cs, "apiserver_request_total", func(labels map[string]string, value float64) {
		counts[countKey(labels["verb"], labels["resource"], labels["subresource"], labels["code"])] += value
	})
	return counts, err
}

// scrapeCounter reads the apiserver's metrics and calls each with the
// labels and value of every series of the named counter.
func scrapeCounter(ctx context.Context, cs kubernetes.Interface, name string, each func(labels map[string]string, value float64)) error {
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").SetHeader("Accept", "text/plain").DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("reading the apiserver's metrics: %w", err)
	}
	prefix := name + "{"
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		end := strings.LastIndexByte(line, '}')
		value, err := strconv.ParseFloat(strings.TrimSpace(line[end+1:]), 64)
		if err != nil {
			continue
		}
		labels := map[string]string{}
		for pair := range strings.SplitSeq(line[len(prefix):end], ",") {
			if k, v, ok := strings.Cut(pair, "="); ok {
				labels[k] = strings.Trim(v, `"`)
			}
		}
		each(labels, value)
	}
	return sc.Err()
}

// usage is what the apiserver served between two snapshots: Lease writes
// that succeeded, Lease writes refused with 409 Conflict, lock status
// writes, Lease and lock reads (GET, LIST), and Lease watch events sent
// (to every watcher: the waiters, the controller, the bench's own watch).
type usage struct {
	leaseWrites, conflicts, statusWrites, leaseReads, lockReads, leaseEvents float64
}

// per is u divided by n.
func (u usage) per(n float64) usage {
	return usage{u.leaseWrites / n, u.conflicts / n, u.statusWrites / n, u.leaseReads / n, u.lockReads / n, u.leaseEvents / n}
}

// snapshot is the apiserver's own counters at one moment.
type snapshot struct {
	requests    requestCounts
	leaseEvents float64
}

// takeSnapshot reads apiserver_request_total and apiserver_watch_events_total.
func takeSnapshot(ctx context.Context, cs kubernetes.Interface) (snapshot, error) {
	requests, err := readRequestCounts(ctx, cs)
	if err != nil {
		return snapshot{}, err
	}
	events, err := readWatchEvents(ctx, cs)
	if err != nil {
		return snapshot{}, err
	}
	return snapshot{requests: requests, leaseEvents: events[leasesResource]}, nil
}

// usageSince is what the apiserver served from before to after.
func usageSince(before, after snapshot) usage {
	u := usage{leaseEvents: after.leaseEvents - before.leaseEvents}
	for key, v := range after.requests {
		delta := v - before.requests[key]
		verb, rest, _ := strings.Cut(key, "|")
		resource, rest, _ := strings.Cut(rest, "|")
		subresource, code, _ := strings.Cut(rest, "|")
		write := verb == "PUT" || verb == "PATCH" || verb == "POST"
		read := verb == "GET" || verb == "LIST"
		ok := strings.HasPrefix(code, "2")
		switch {
		case resource == leasesResource && write && ok:
			u.leaseWrites += delta
		case resource == leasesResource && write && (code == "409" || code == "422"):
			// A 409 is an Update whose resourceVersion moved; a 422 a patch
			// whose tests failed: both are writes that lost a race.
			u.conflicts += delta
		case resource == "distributedlocks" && subresource == "status" && write && ok:
			u.statusWrites += delta
		case resource == leasesResource && read:
			u.leaseReads += delta
		case resource == "distributedlocks" && read:
			u.lockReads += delta
		}
	}
	return u
}

// row is a WritesRow of usage u per unit.
func row(scenario, per string, n int, u usage, worstOvertaking int) WritesRow {
	return WritesRow{Scenario: scenario, Per: per, N: n, LeaseWrites: u.leaseWrites, LeaseConflicts: u.conflicts,
		StatusWrites: u.statusWrites, LeaseReads: u.leaseReads, LockReads: u.lockReads, LeaseEvents: u.leaseEvents,
		WorstOvertaking: worstOvertaking}
}

// measureRenewalWrites holds lock name with a client renewing every 200ms
// for a few seconds and counts what its renewals (the client's own count,
// frontdesk_client_renewals_total) cost the apiserver.
func measureRenewalWrites(ctx context.Context, cs kubernetes.Interface, newClient func(lock.Config) (*lock.Client, error),
	name string, window time.Duration) (WritesRow, error) {
	reg := prometheus.NewRegistry()
	metrics, err := lock.NewMetrics(reg)
	if err != nil {
		return WritesRow{}, err
	}
	c, err := newClient(lock.Config{Namespace: namespace, Name: name, Identity: "renewer", RenewInterval: 200 * time.Millisecond, Metrics: metrics})
	if err != nil {
		return WritesRow{}, err
	}
	g, err := c.TryAcquire(ctx)
	if err != nil {
		return WritesRow{}, err
	}
	defer func() { _ = g.Release(context.Background()) }()
	time.Sleep(time.Second) // the grant's own writes and status settle before counting
	waitQuiet(ctx, cs, name)
	renewals := func() float64 { return counterValue(reg, "frontdesk_client_renewals_total") }
	before, renewedBefore := takeSnapshot(ctx, cs)
	r0 := renewals()
	if renewedBefore != nil {
		return WritesRow{}, renewedBefore
	}
	time.Sleep(window)
	after, err := takeSnapshot(ctx, cs)
	if err != nil {
		return WritesRow{}, err
	}
	n := renewals() - r0
	if n == 0 {
		return WritesRow{}, fmt.Errorf("no renewal in %s", window)
	}
	return row("holding the lock (renewing every 200ms)", "renewal", int(n), usageSince(before, after).per(n), -1), nil
}

// counterValue is the sum of a counter's values gathered from reg.
func counterValue(reg prometheus.Gatherer, name string) float64 {
	families, err := reg.Gather()
	if err != nil {
		return 0
	}
	var sum float64
	for _, f := range families {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// measureGrantWrites keeps `waiters` clients queued on lock name behind a
// holder; each holder releases at once and queues again. Once every waiter
// is queued it counts what `grants` grants cost, and how far any grant
// overtook the queue's arrival order (seen on a watch of the Lease: tickets
// in the order they joined the queue, and the ticket each hand-off names).
func measureGrantWrites(ctx context.Context, cs kubernetes.Interface, newClient func(identity string) (*lock.Client, error),
	name string, waiters, grants int) (WritesRow, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	order := &arrivalOrder{joined: map[string]int{}}
	w, err := cs.CoordinationV1().Leases(namespace).Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		return WritesRow{}, err
	}
	defer w.Stop()
	go order.follow(w.ResultChan())

	var granted atomic.Int64
	var counting atomic.Bool
	errs := make(chan error, waiters+1)
	var wg sync.WaitGroup
	for i := range waiters + 1 {
		c, err := newClient(fmt.Sprintf("writes-%d", i))
		if err != nil {
			return WritesRow{}, err
		}
		wg.Go(func() {
			for ctx.Err() == nil {
				g, err := c.Acquire(ctx)
				if err != nil {
					if ctx.Err() == nil {
						errs <- err
						cancel()
					}
					return
				}
				if counting.Load() {
					granted.Add(1)
				}
				// Work for a moment, as holders do: long enough for the
				// previous holder to be back in the queue (three requests)
				// before this one releases, so that every grant is one among
				// queued waiters.
				time.Sleep(holdForWrites)
				if err := g.Release(context.Background()); err != nil && ctx.Err() == nil {
					errs <- err
					cancel()
					return
				}
			}
		})
	}
	defer wg.Wait()
	defer cancel()
	for order.queued() < waiters && ctx.Err() == nil { // every waiter in the queue
		time.Sleep(5 * time.Millisecond)
	}
	before, err := takeSnapshot(ctx, cs)
	if err != nil {
		return WritesRow{}, err
	}
	counting.Store(true)
	for granted.Load() < int64(grants) && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	counting.Store(false)
	after, err := takeSnapshot(ctx, cs)
	if err != nil {
		return WritesRow{}, err
	}
	n := float64(granted.Load())
	select {
	case err := <-errs:
		return WritesRow{}, err
	default:
	}
	return row(fmt.Sprintf("grants, %d waiters queued", waiters), "grant", int(n), usageSince(before, after).per(n), order.worst()), nil
}

// holdForWrites is how long each holder keeps the lock while writes are
// counted.
const holdForWrites = 150 * time.Millisecond

// measureCrowdWrites counts what the grants of a crowd cost: n clients
// (all for one lock) start Acquire at the same moment, and each holds the lock
// for a moment and releases it. Every Lease write the apiserver took
// during the whole episode, the lost races (409s, 422s) included, is
// divided by the n grants.
func measureCrowdWrites(ctx context.Context, cs kubernetes.Interface, newClient func(identity string) (*lock.Client, error),
	n int) (WritesRow, error) {
	crowd := make([]*lock.Client, n)
	for i := range crowd {
		var err error
		if crowd[i], err = newClient(fmt.Sprintf("crowd-%d", i)); err != nil {
			return WritesRow{}, err
		}
	}
	before, err := takeSnapshot(ctx, cs)
	if err != nil {
		return WritesRow{}, err
	}
	start := make(chan struct{})
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for _, c := range crowd {
		wg.Go(func() {
			<-start
			g, err := c.Acquire(ctx)
			if err != nil {
				errs <- err
				return
			}
			time.Sleep(holdInCrowd)
			errs <- g.Release(context.Background())
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return WritesRow{}, fmt.Errorf("a client of the crowd: %w", err)
		}
	}
	after, err := takeSnapshot(ctx, cs)
	if err != nil {
		return WritesRow{}, err
	}
	return row(fmt.Sprintf("grants, %d clients arriving at once", n), "grant", n, usageSince(before, after).per(float64(n)), -1), nil
}

// holdInCrowd is how long each client of a crowd holds the lock.
const holdInCrowd = 20 * time.Millisecond

// arrivalOrder follows a Lease's queue: when each ticket joined it, and
// the order in which hand-offs named them.
type arrivalOrder struct {
	mu      sync.Mutex
	joined  map[string]int // ticket -> arrival number
	next    int
	current int // waiters queued now
	granted []string
	lastRV  string
}

func (a *arrivalOrder) follow(events <-chan watch.Event) {
	for ev := range events {
		l, ok := ev.Object.(*coordinationv1.Lease)
		if !ok {
			continue
		}
		a.mu.Lock()
		q := lease.Queue(l)
		for _, w := range q {
			if _, seen := a.joined[w.Ticket]; !seen {
				a.joined[w.Ticket] = a.next
				a.next++
			}
		}
		a.current = len(q)
		if t := l.Annotations[locksv1alpha1.TicketAnnotation]; t != "" && l.ResourceVersion != a.lastRV &&
			(len(a.granted) == 0 || a.granted[len(a.granted)-1] != t) {
			a.granted = append(a.granted, t)
		}
		a.lastRV = l.ResourceVersion
		a.mu.Unlock()
	}
}

func (a *arrivalOrder) queued() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.current
}

// worst is the largest overtaking: for a granted ticket, how many tickets
// that joined after it were granted before it.
func (a *arrivalOrder) worst() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	worst := 0
	for i, t := range a.granted {
		arrived, ok := a.joined[t]
		if !ok {
			continue
		}
		over := 0
		for _, earlier := range a.granted[:i] {
			if n, ok := a.joined[earlier]; ok && n > arrived {
				over++
			}
		}
		worst = max(worst, over)
	}
	return worst
}

func printWrites(out io.Writer, rows []WritesRow) {
	fmt.Fprintf(out, "\nrequests to the apiserver, counted by the apiserver (apiserver_request_total, apiserver_watch_events_total)\n\n")
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	fmt.Fprintln(w, "scenario\tper\tn\tLease writes\tLease 409s\tstatus writes\tLease reads\tlock reads\tLease watch events\tworst overtaking\t")
	for _, r := range rows {
		over := "-"
		if r.WorstOvertaking >= 0 {
			over = strconv.Itoa(r.WorstOvertaking)
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.1f\t%s\t\n", r.Scenario, r.Per, r.N,
			r.LeaseWrites, r.LeaseConflicts, r.StatusWrites, r.LeaseReads, r.LockReads, r.LeaseEvents, over)
	}
	_ = w.Flush()
}

// waitQuiet waits (at most 30 s) until no Lease of the bench's namespace
// but name's has a holder or a queue: a grant or a place left by an
// earlier measurement would be ended or removed by the controller in the
// middle of this one, and the apiserver's counters, which count every
// Lease, would charge it those writes.
func waitQuiet(ctx context.Context, cs kubernetes.Interface, name string) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		list, err := cs.CoordinationV1().Leases(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		quiet := true
		for i := range list.Items {
			l := &list.Items[i]
			if l.Name != name && (lease.Holder(l) != "" || len(lease.Queue(l)) > 0) {
				quiet = false
			}
		}
		if quiet {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}
