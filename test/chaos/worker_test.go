package chaos

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/frontdesk-dev/frontdesk/pkg/fencing"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
	"github.com/frontdesk-dev/frontdesk/test/internal/harness"
)

// workerEnv makes the test binary run as a chaos worker process.
const workerEnv = "FRONTDESK_CHAOS_WORKER"

// runWorker does fenced increments on the ledger: per grant, a fenced
// begin, then read-and-increment a few times, then release. It prints one
// line per event, with wall-clock nanoseconds (all processes share the
// machine's clock):
//
//	acquire <call> <return> <token>
//	release <call> <return>
//	end <at> <token> <cause>   (the grant's Context ended: lost or released)
//	done
func runWorker() int {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	var wf harness.WorkerFlags
	wf.Register(fs)
	increments := fs.Int("increments", 10, "increments to get accepted in all")
	perGrant := fs.Int("per-grant", 3, "increments per grant")
	hold := fs.Duration("hold", 0, "how long to keep the lock after the increments of a grant")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	cfg, err := wf.RestConfig(5 * time.Second)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	c, err := lock.New(cfg, lock.Config{Namespace: wf.Namespace, Name: wf.Lock})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	w := &ledgerClient{url: wf.URL, http: &http.Client{Timeout: 5 * time.Second}}
	done := 0
	deadline := time.Now().Add(3 * time.Minute)
	for done < *increments && time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		call := time.Now().UnixNano()
		g, err := c.Acquire(ctx)
		cancel()
		if err != nil {
			fmt.Println("acquire-error", strings.ReplaceAll(err.Error(), "\n", " "))
			time.Sleep(100 * time.Millisecond) // the lock may be gone for a while (deleted and created again)
			continue
		}
		fmt.Printf("acquire %d %d %d\n", call, time.Now().UnixNano(), g.Token())
		go func(g *lock.Grant) {
			<-g.Context().Done()
			// When this holder stopped believing it holds the lock: lost, or
			// released.
			fmt.Printf("end %d %d %s\n", time.Now().UnixNano(), g.Token(), strings.ReplaceAll(context.Cause(g.Context()).Error(), "\n", " "))
		}(g)
		if w.fenced(g.Token(), "/begin", "") {
			for range *perGrant {
				if done >= *increments || g.Context().Err() != nil {
					break
				}
				value, err := w.value()
				if err != nil {
					break
				}
				if !w.fenced(g.Token(), "/increment", "?from="+strconv.Itoa(value)) {
					break
				}
				done++
				time.Sleep(20 * time.Millisecond) // work between increments
			}
		}
		select {
		case <-time.After(*hold): // keep holding, renewing in the background
		case <-g.Lost():
		}
		call = time.Now().UnixNano()
		relCtx, cancelRel := context.WithTimeout(context.Background(), 3*time.Second)
		_ = g.Release(relCtx)
		cancelRel()
		fmt.Printf("release %d %d\n", call, time.Now().UnixNano())
	}
	fmt.Println("done", done)
	return 0
}

type ledgerClient struct {
	url  string
	http *http.Client
}

// fenced posts a fenced write and reports whether it was accepted.
func (l *ledgerClient) fenced(token int64, path, query string) bool {
	req, _ := http.NewRequest(http.MethodPost, l.url+path+query, nil)
	req.Header.Set(fencing.TokenHeader, strconv.FormatInt(token, 10))
	resp, err := l.http.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func (l *ledgerClient) value() (int, error) {
	resp, err := l.http.Get(l.url + "/value")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}
