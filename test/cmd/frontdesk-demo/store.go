package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/frontdesk-dev/frontdesk/pkg/fencing"
)

// storedWrite is one write the store accepted: when (the store's clock),
// who, and with which fencing token.
type storedWrite struct {
	At     time.Time `json:"at"`
	Writer string    `json:"writer"`
	Token  int64     `json:"token"`
}

// store is a fenced store in memory: POST /write?writer=NAME behind
// fencing.Middleware (the token in X-Fencing-Token, a stale one refused with
// 409 Conflict), and GET /writes, every accepted write in order.
type store struct {
	mu     sync.Mutex
	writes []storedWrite
}

// storeMain is `frontdesk-demo store`: the fenced store of the e2e failover
// test, which times a failover by the store's record of the next holder's
// first accepted write. It returns the exit status.
func storeMain(args []string) int {
	fs := flag.NewFlagSet("store", flag.ContinueOnError)
	listen := fs.String("listen", ":8080", "address to serve on")
	key := fs.String("lock", "", "the fencing key every write is checked against (NAMESPACE/NAME of the lock)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *key == "" {
		fmt.Fprintln(os.Stderr, "store: --lock is required")
		return 2
	}
	s := &store{}
	mux := http.NewServeMux()
	mux.Handle("POST /write", fencing.Middleware(fencing.NewMemoryGuard(), fencing.FixedLock(*key), http.HandlerFunc(s.write)))
	mux.HandleFunc("GET /writes", s.list)
	srv := &http.Server{Addr: *listen, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	fmt.Printf("store serving on %s (fencing key %s)\n", *listen, *key)
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(os.Stderr, "store:", err)
		return 1
	}
	return 0
}

// write records a write the guard let through (its token is current).
func (s *store) write(w http.ResponseWriter, r *http.Request) {
	var token int64
	_, _ = fmt.Sscan(r.Header.Get(fencing.TokenHeader), &token)
	wr := storedWrite{At: time.Now(), Writer: r.URL.Query().Get("writer"), Token: token}
	s.mu.Lock()
	s.writes = append(s.writes, wr)
	s.mu.Unlock()
	fmt.Printf("%s accepted the write of %s with fencing token %d\n", wr.At.Format(time.RFC3339Nano), wr.Writer, wr.Token)
	fmt.Fprintf(w, "written with fencing token %d\n", token)
}

// list answers every accepted write, as JSON.
func (s *store) list(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	writes := append([]storedWrite{}, s.writes...)
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(writes) //nolint:errchkjson // only the write can fail, and then the client is gone
}
