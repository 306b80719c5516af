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
		for _, pair := range strings.Split(line[len(prefix):end], ",") {
			if k, v, ok := strings.Cut(pair, "="); ok {
				labels[k] = strings.Trim(v, `"`)
			}
		}
		each(labels, value)
	}
	return sc.Err()
}

// writesSince is the Lease writes, Lease conflicts and lock status writes
// between two readings.
func writesSince(before, after requestCounts) (leaseWrites, conflicts, statusWrites float64) {
	for key, v := range after {
		delta := v - before[key]
		verb, rest, _ := strings.Cut(key, "|")
		resource, rest, _ := strings.Cut(rest, "|")
		subresource, code, _ := strings.Cut(rest, "|")
		if verb != "PUT" && verb != "PATCH" && verb != "POST" {
			continue
		}
		switch {
		case resource == "leases" && strings.HasPrefix(code, "2"):
			leaseWrites += delta
		case resource == "leases" && code == "409":
			conflicts += delta
		case resource == "distributedlocks" && subresource == "status" && strings.HasPrefix(code, "2"):
			statusWrites += delta
		}
	}
	return leaseWrites, conflicts, statusWrites
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
	defer g.Release(context.Background())
	time.Sleep(time.Second) // the grant's own writes and status settle before counting
	renewals := func() float64 { return counterValue(reg, "frontdesk_client_renewals_total") }
	before, renewedBefore := readRequestCounts(ctx, cs)
	r0 := renewals()
	if renewedBefore != nil {
		return WritesRow{}, renewedBefore
	}
	time.Sleep(window)
	after, err := readRequestCounts(ctx, cs)
	if err != nil {
		return WritesRow{}, err
	}
	n := renewals() - r0
	if n == 0 {
		return WritesRow{}, fmt.Errorf("no renewal in %s", window)
	}
	lw, cf, sw := writesSince(before, after)
	return WritesRow{Scenario: "holding the lock (renewing every 200ms)", Per: "renewal", N: int(n),
		LeaseWrites: lw / n, LeaseConflicts: cf / n, StatusWrites: sw / n, WorstOvertaking: -1}, nil
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
	before, err := readRequestCounts(ctx, cs)
	if err != nil {
		return WritesRow{}, err
	}
	counting.Store(true)
	for granted.Load() < int64(grants) && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	counting.Store(false)
	after, err := readRequestCounts(ctx, cs)
	if err != nil {
		return WritesRow{}, err
	}
	n := float64(granted.Load())
	select {
	case err := <-errs:
		return WritesRow{}, err
	default:
	}
	lw, cf, sw := writesSince(before, after)
	return WritesRow{Scenario: fmt.Sprintf("grants, %d waiters queued", waiters), Per: "grant", N: int(n),
		LeaseWrites: lw / n, LeaseConflicts: cf / n, StatusWrites: sw / n, WorstOvertaking: order.worst()}, nil
}

// holdForWrites is how long each holder keeps the lock while writes are
// counted.
const holdForWrites = 150 * time.Millisecond

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
		if t := l.Annotations[lease.TicketAnnotation]; t != "" && l.ResourceVersion != a.lastRV &&
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
	fmt.Fprintf(out, "\nwrites to the apiserver, counted by the apiserver (apiserver_request_total)\n\n")
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	fmt.Fprintln(w, "scenario\tper\tn\tLease writes\tLease 409s\tstatus writes\tworst overtaking\t")
	for _, r := range rows {
		over := "-"
		if r.WorstOvertaking >= 0 {
			over = strconv.Itoa(r.WorstOvertaking)
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%.2f\t%.2f\t%.2f\t%s\t\n", r.Scenario, r.Per, r.N, r.LeaseWrites, r.LeaseConflicts, r.StatusWrites, over)
	}
	_ = w.Flush()
}
