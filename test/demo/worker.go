package demo

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/frontdesk-dev/frontdesk/pkg/fencing"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// Worker states, printed one per line as "state <name> [token] [detail]".
const (
	stateWaiting  = "waiting"
	stateHolding  = "holding"
	stateCharging = "charging"
	stateDone     = "done"
	stateIdle     = "idle"
	stateFenced   = "fenced"
)

// noteLost is printed as "note lost <token>" when a grant is lost: a fact
// about the lock, not a state of the job (a thawed worker keeps charging).
const noteLost = "lost"

// worker is one replica of the billing service. Its job is the incident's:
// on getting the lock it loads the batch of unbilled customers and charges
// each, checking its lock only when it starts (as most real jobs do).
// Checking before every write would narrow the window, never close it: a
// pause can land between the check and the write. That is what fencing is for.
type worker struct {
	ledger    string
	name      string
	perCharge time.Duration
	http      *http.Client
	mu        sync.Mutex
}

// WorkerMain runs a worker process with the given flags and returns its
// exit status.
func WorkerMain(args []string) int {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "admin kubeconfig")
	namespace := fs.String("namespace", "default", "lock namespace")
	lockName := fs.String("lock", "billing", "lock name")
	ledger := fs.String("ledger", "", "ledger URL")
	name := fs.String("name", "", "worker name")
	perCharge := fs.Duration("per-charge", time.Millisecond, "time per charge")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	c, err := lock.New(cfg, lock.Config{Namespace: *namespace, Name: *lockName})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	w := &worker{ledger: *ledger, name: *name, perCharge: *perCharge, http: &http.Client{Timeout: 30 * time.Second}}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	w.run(ctx, c)
	return 0
}

func (w *worker) note(what string, token int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	fmt.Printf("note %s %d\n", what, token)
}

func (w *worker) say(state string, token int64, detail string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	fmt.Printf("state %s %d %s\n", state, token, detail)
}

// jobOutcome is how a run of the job under one grant ended.
type jobOutcome int

const (
	// jobFinished: the job is complete (now or already); keep the lock.
	jobFinished jobOutcome = iota
	// jobFenced: the ledger refused this grant's token; the lock is lost.
	jobFenced
	// jobFailed: the ledger could not be reached; give the lock up and
	// try again later.
	jobFailed
)

// run competes for the lock until ctx ends, doing the job whenever it holds
// the lock and the job is not complete.
func (w *worker) run(ctx context.Context, c *lock.Client) {
	for ctx.Err() == nil {
		w.say(stateWaiting, 0, "")
		g, err := c.Acquire(ctx)
		if err != nil {
			if ctx.Err() == nil {
				w.say(stateWaiting, 0, "error: "+err.Error())
				time.Sleep(100 * time.Millisecond) // back off before the next Acquire
			}
			continue
		}
		token := g.Token()
		w.say(stateHolding, token, "")
		go func() {
			<-g.Context().Done()
			if g.Err() != nil {
				w.note(noteLost, token)
			}
		}()
		switch w.job(ctx, token) {
		case jobFinished:
			// Keep the lock until told to stop or until it is lost.
			select {
			case <-ctx.Done():
			case <-g.Lost():
			}
			_ = g.Release(context.Background())
		case jobFenced:
			_ = g.Release(context.Background()) // nothing to release: it was lost
		case jobFailed:
			_ = g.Release(context.Background())
			time.Sleep(500 * time.Millisecond) // let the ledger come up before competing again
		}
	}
}

// job charges the unbilled batch with token.
func (w *worker) job(ctx context.Context, token int64) jobOutcome {
	var complete bool
	if err := getJSON(ctx, w.http, w.ledger+"/complete", &complete); err != nil {
		w.say(stateWaiting, token, "error: "+err.Error())
		return jobFailed
	}
	if complete {
		w.say(stateIdle, token, "job already complete")
		return jobFinished
	}
	// Fence first, then read: registering the token before loading the batch
	// makes the ledger refuse an older holder's late writes, so none of them
	// can land after the batch was read (and be charged again).
	switch status, err := w.post(ctx, "/begin?worker="+url.QueryEscape(w.name), token); {
	case err == nil && status == http.StatusConflict:
		w.say(stateFenced, token, "run rejected: stale fencing token")
		return jobFenced
	case err != nil || status != http.StatusCreated:
		w.say(stateWaiting, token, fmt.Sprintf("error: begin: %v (status %d)", err, status))
		return jobFailed
	}
	var batch []int
	if err := getJSON(ctx, w.http, w.ledger+"/unbilled", &batch); err != nil {
		w.say(stateWaiting, token, "error: "+err.Error())
		return jobFailed
	}
	w.say(stateCharging, token, fmt.Sprint(len(batch)))
	next := time.Now()
	for _, customer := range batch {
		if ctx.Err() != nil {
			return jobFinished
		}
		status, err := w.post(ctx, fmt.Sprintf("/charge?customer=%d&worker=%s", customer, url.QueryEscape(w.name)), token)
		if err == nil && status == http.StatusConflict {
			w.say(stateFenced, token, fmt.Sprintf("charge of customer %d rejected: stale fencing token", customer))
			return jobFenced
		}
		// The job's pace. Far behind it (a thawed worker), carry on at the
		// pace rather than catch up in a burst.
		next = next.Add(w.perCharge)
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		} else if -d > 50*w.perCharge {
			next = time.Now()
		}
	}
	if status, err := w.post(ctx, "/complete?worker="+url.QueryEscape(w.name), token); err == nil && status == http.StatusConflict {
		w.say(stateFenced, token, "completion rejected: stale fencing token")
		return jobFenced
	}
	w.say(stateDone, token, fmt.Sprint(len(batch)))
	return jobFinished
}

func (w *worker) post(ctx context.Context, path string, token int64) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.ledger+path, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set(fencing.TokenHeader, fmt.Sprint(token))
	resp, err := w.http.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// getJSON decodes the JSON answer of a GET of url into v; an answer other
// than 200 OK is an error. The ledger's workers and chargers read it so.
func getJSON(ctx context.Context, hc *http.Client, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
