// Command ledger is the fenced HTTP service of the shell example
// (examples/shell): POST /charges records a charge behind
// fencing.Middleware, which answers 409 Conflict to a request whose
// X-Fencing-Token is lower than one it has already accepted; GET /charges
// lists the charges recorded, one per line (reads are not fenced).
//
//	go run -C examples ./shell/ledger --addr 127.0.0.1:8080 --lock billing
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"

	"github.com/frontdesk-dev/frontdesk/pkg/fencing"
)

type charge struct {
	customer, amount string
	token            int64
}

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address to listen on (port 0: any free port)")
	lockName := flag.String("lock", "billing", "the lock whose fencing tokens the ledger checks")
	flag.Parse()

	var (
		mu      sync.Mutex
		charges []charge
	)
	record := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The middleware has checked the token: it is at least the highest
		// accepted, and becomes the new floor if this answer is a 2xx.
		token, _ := strconv.ParseInt(r.Header.Get(fencing.TokenHeader), 10, 64)
		c := charge{customer: r.PostFormValue("customer"), amount: r.PostFormValue("amount"), token: token}
		if c.customer == "" || c.amount == "" {
			http.Error(w, "customer and amount are required", http.StatusBadRequest)
			return
		}
		mu.Lock()
		charges = append(charges, c)
		mu.Unlock()
		fmt.Fprintf(w, "charged %s %s (fencing token %d)\n", c.customer, c.amount, c.token)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /charges", fencing.Middleware(fencing.NewMemoryGuard(), fencing.FixedLock(*lockName), record))
	mux.HandleFunc("GET /charges", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range charges {
			fmt.Fprintf(w, "%s %s %d\n", c.customer, c.amount, c.token)
		}
	})

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ledger:", err)
		os.Exit(1)
	}
	fmt.Printf("ledger for lock %s listening on http://%s\n", *lockName, ln.Addr())
	if err := http.Serve(ln, mux); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(os.Stderr, "ledger:", err)
		os.Exit(1)
	}
}
