// Package fencingtest holds the tests every fencing.Guard must pass, run
// against any backend: pkg/fencing runs them on its MemoryGuard, the test
// module on a SQLGuard over SQLite (a database driver the library does not
// require), and a Guard of your own can run them too.
package fencingtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/frontdesk-dev/frontdesk/pkg/fencing"
)

// Backend is a Guard under test with the state it protects: a counter.
type Backend struct {
	// Guard is the guard under test.
	Guard fencing.Guard
	// Inc adds one to the counter; the tests run it inside Fence, with the
	// context Fence passes on.
	Inc func(ctx context.Context) error
	// Read returns the counter.
	Read func() int
	// Transactional says the guard undoes the writes of an operation that
	// failed or panicked (SQLGuard), so Read counts committed writes only.
	Transactional bool
}

// billing is the key of the lock the tests fence on.
var billing = fencing.LockKey("payments", "billing")

// Run runs every test on fresh backends from newBackend, one per subtest.
func Run(t *testing.T, newBackend func(t *testing.T) Backend) {
	t.Run("AdmitsByToken", func(t *testing.T) { testAdmitsByToken(t, newBackend(t)) })
	t.Run("LocksOfOneNameInTwoNamespacesAreFencedApart", func(t *testing.T) {
		testLocksOfOneNameInTwoNamespacesAreFencedApart(t, newBackend(t))
	})
	t.Run("DoesNotRecordTokenWhenOperationFails", func(t *testing.T) { testDoesNotRecordTokenWhenOperationFails(t, newBackend(t)) })
	t.Run("ConcurrentWritersNeverAdmitLowerAfterHigher", func(t *testing.T) {
		testConcurrentWritersNeverAdmitLowerAfterHigher(t, newBackend(t))
	})
	t.Run("RollsBackWhenOperationPanics", func(t *testing.T) { testRollsBackWhenOperationPanics(t, newBackend(t)) })
	t.Run("MiddlewareCommitsOnlySuccessfulRequests", func(t *testing.T) {
		testMiddlewareCommitsOnlySuccessfulRequests(t, newBackend(t))
	})
}

// step is one Fence call and what it must return: a StaleTokenError naming
// current when wantErr, else nil.
type step struct {
	lock    string
	token   int64
	wantErr bool
	current int64
}

func testAdmitsByToken(t *testing.T, b Backend) {
	runSteps(t, b, []step{
		{billing, 3, false, 0},
		{billing, 3, false, 0}, // the same holder writes again
		{billing, 5, false, 0}, // a newer holder
		{billing, 4, true, 5},  // the paused old holder wakes up
		{billing, 3, true, 5},
		{fencing.LockKey("payments", "invoices"), 1, false, 0}, // locks are independent
		{billing, 6, false, 0},
	})
}

// Two locks named billing, in the namespaces default and team-a, fenced on
// one guard by their keys (what their grants' FencingKey return): each
// keeps its own highest token. Keyed by the bare name, team-a's first
// holder (token 1) would be refused after default's token 5.
func testLocksOfOneNameInTwoNamespacesAreFencedApart(t *testing.T, b Backend) {
	defaultBilling, teamBilling := fencing.LockKey("default", "billing"), fencing.LockKey("team-a", "billing")
	if defaultBilling == teamBilling {
		t.Fatalf("locks of one name in two namespaces have one key, %q", defaultBilling)
	}
	runSteps(t, b, []step{
		{defaultBilling, 5, false, 0},
		{teamBilling, 1, false, 0}, // below default's 5: another lock
		{teamBilling, 2, false, 0},
		{defaultBilling, 4, true, 5}, // default's paused holder, against default's 5
		{teamBilling, 1, true, 2},    // team-a's, against team-a's 2
		{defaultBilling, 5, false, 0},
		{teamBilling, 3, false, 0},
	})
}

// runSteps makes the Fence calls of steps in order, each incrementing the
// counter, and checks each answer and the counter.
func runSteps(t *testing.T, b Backend, steps []step) {
	t.Helper()
	admitted := 0
	for i, s := range steps {
		err := b.Guard.Fence(context.Background(), s.lock, s.token, b.Inc)
		if !s.wantErr {
			if err != nil {
				t.Fatalf("step %d: token %d on %s rejected: %v", i, s.token, s.lock, err)
			}
			admitted++
			continue
		}
		var stale *fencing.StaleTokenError
		if !errors.As(err, &stale) || !errors.Is(err, fencing.ErrStaleToken) {
			t.Fatalf("step %d: token %d on %s: got %v, want a StaleTokenError", i, s.token, s.lock, err)
		}
		if stale.Current != s.current || stale.Token != s.token || stale.Lock != s.lock {
			t.Errorf("step %d: error %+v, want current %d", i, stale, s.current)
		}
	}
	if got := b.Read(); got != admitted {
		t.Errorf("protected counter = %d, want %d admitted operations", got, admitted)
	}
}

func testDoesNotRecordTokenWhenOperationFails(t *testing.T, b Backend) {
	ctx := context.Background()
	if err := b.Guard.Fence(ctx, "l", 2, b.Inc); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("write failed")
	if err := b.Guard.Fence(ctx, "l", 9, func(context.Context) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("got %v, want the operation's error", err)
	}
	if err := b.Guard.Fence(ctx, "l", 3, b.Inc); err != nil {
		t.Errorf("token 3 after a failed write with 9: %v; the failed write must not raise the floor", err)
	}
}

// Many writers with interleaved tokens race on one lock: the sequence of
// admitted tokens, in the order the operations ran, never goes down.
func testConcurrentWritersNeverAdmitLowerAfterHigher(t *testing.T, b Backend) {
	var mu sync.Mutex
	var order []int64
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				token := int64(i*8 + w%3)
				_ = b.Guard.Fence(context.Background(), "l", token, func(context.Context) error {
					mu.Lock()
					order = append(order, token)
					mu.Unlock()
					return nil
				})
			}
		}()
	}
	wg.Wait()
	if len(order) == 0 {
		t.Fatal("nothing was admitted")
	}
	for i := 1; i < len(order); i++ {
		if order[i] < order[i-1] {
			t.Fatalf("admitted token %d after %d (position %d)", order[i], order[i-1], i)
		}
	}
}

// A panic inside the fenced operation rolls everything back and goes on to
// the caller: the token is not recorded, a SQL transaction is not leaked
// (a leaked one holds SQLite's write lock, so the next fenced write fails
// with "database is locked"), and the operation's writes are undone.
func testRollsBackWhenOperationPanics(t *testing.T, b Backend) {
	ctx := context.Background()
	if err := b.Guard.Fence(ctx, "l", 2, b.Inc); err != nil {
		t.Fatal(err)
	}
	recovered := func() (v any) {
		defer func() { v = recover() }()
		_ = b.Guard.Fence(ctx, "l", 9, func(ctx context.Context) error {
			if err := b.Inc(ctx); err != nil {
				t.Errorf("write before the panic: %v", err)
			}
			panic("boom")
		})
		return nil
	}()
	if recovered != "boom" {
		t.Fatalf("recovered %v, want the operation's own panic passed on", recovered)
	}

	next, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := b.Guard.Fence(next, "l", 3, b.Inc); err != nil {
		t.Fatalf("the next fenced write after a panic: %v; the panicked operation must be rolled back (token 9 not recorded, no transaction left open)", err)
	}
	if b.Transactional {
		if got := b.Read(); got != 2 {
			t.Errorf("counter = %d, want 2: the write made before the panic must be rolled back", got)
		}
	}
}

// A request whose handler fails (4xx/5xx, or Abort) leaves neither its
// writes nor its token: the next request with a lower token than the failed
// one is still accepted. 2xx and 3xx commit.
func testMiddlewareCommitsOnlySuccessfulRequests(t *testing.T, b Backend) {
	srv := httptest.NewServer(fencing.Middleware(b.Guard, fencing.FixedLock(billing), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := b.Inc(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if r.URL.Query().Get("abort") != "" {
			fencing.Abort(r.Context())
		}
		status, _ := strconv.Atoi(r.URL.Query().Get("status"))
		w.Header().Set("X-Handler", "ran")
		w.WriteHeader(status)
		fmt.Fprintf(w, "handler answered %d", status)
	})))
	defer srv.Close()
	noRedirects := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

	steps := []struct {
		token, query string
		wantStatus   int
		wantBody     string
		committed    bool
	}{
		{"5", "status=201", http.StatusCreated, "handler answered 201", true},
		{"9", "status=500", http.StatusInternalServerError, "handler answered 500", false},
		{"6", "status=201", http.StatusCreated, "handler answered 201", true}, // 9 was not recorded
		{"9", "status=404", http.StatusNotFound, "handler answered 404", false},
		{"9", "status=200&abort=1", http.StatusOK, "handler answered 200", false},
		{"7", "status=200", http.StatusOK, "handler answered 200", true},
		{"8", "status=303", http.StatusSeeOther, "handler answered 303", true},
		{"7", "status=200", http.StatusConflict, `"currentToken":8`, false},
	}
	committed := 0
	for i, s := range steps {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/charges?"+s.query, nil)
		req.Header.Set(fencing.TokenHeader, s.token)
		req.Header.Set("Location", "/elsewhere")
		resp, err := noRedirects.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != s.wantStatus || !strings.Contains(string(body), s.wantBody) {
			t.Errorf("step %d (token %s, %s): %d %q, want %d containing %q", i, s.token, s.query, resp.StatusCode, body, s.wantStatus, s.wantBody)
		}
		if s.wantStatus != http.StatusConflict && resp.Header.Get("X-Handler") != "ran" {
			t.Errorf("step %d: the handler's headers were not passed on: %v", i, resp.Header)
		}
		if s.committed {
			committed++
		}
		if b.Transactional {
			if got := b.Read(); got != committed {
				t.Errorf("step %d (token %s, %s): %d writes committed, want %d", i, s.token, s.query, got, committed)
			}
		}
	}
}
