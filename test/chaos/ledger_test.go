package chaos

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"

	"github.com/frontdesk-dev/frontdesk/pkg/fencing"
)

// write is one fenced write the ledger accepted.
type write struct {
	token int64
	from  int // the value the writer read; -1 for a begin
}

// ledger is a counter behind a fencing Guard. It keeps every accepted
// write, in the order they were applied, and counts the rejected ones.
type ledger struct {
	srv *httptest.Server

	mu       sync.Mutex
	value    int
	history  []write
	rejected int
}

func newLedger() *ledger {
	l := &ledger{}
	guard := fencing.NewMemoryGuard()
	mux := http.NewServeMux()
	fenced := func(h http.HandlerFunc) http.Handler {
		return fencing.Middleware(guard, fencing.FixedLock("counter"), h)
	}
	mux.Handle("POST /begin", fenced(func(w http.ResponseWriter, r *http.Request) {
		l.record(r, -1)
	}))
	mux.Handle("POST /increment", fenced(func(w http.ResponseWriter, r *http.Request) {
		from, err := strconv.Atoi(r.URL.Query().Get("from"))
		if err != nil {
			http.Error(w, "need ?from=N", http.StatusBadRequest)
			return
		}
		l.record(r, from)
	}))
	mux.HandleFunc("GET /value", func(w http.ResponseWriter, r *http.Request) {
		l.mu.Lock()
		defer l.mu.Unlock()
		fmt.Fprintln(w, l.value)
	})
	// Count rejections: wrap the mux to see 409s.
	l.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		mux.ServeHTTP(rec, r)
		if rec.status == http.StatusConflict {
			l.mu.Lock()
			l.rejected++
			l.mu.Unlock()
		}
	}))
	return l
}

// record applies an accepted write: an increment sets value to from+1,
// whatever the value is now, so a lost update shows in the history.
func (l *ledger) record(r *http.Request, from int) {
	token, _ := strconv.ParseInt(r.Header.Get(fencing.TokenHeader), 10, 64)
	l.mu.Lock()
	defer l.mu.Unlock()
	if from >= 0 {
		l.value = from + 1
	}
	l.history = append(l.history, write{token: token, from: from})
}

func (l *ledger) snapshot() (int, []write, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.value, append([]write(nil), l.history...), l.rejected
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}
