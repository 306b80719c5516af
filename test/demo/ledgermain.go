package demo

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// LedgerMain serves the ledger as a process of its own (for the scenario
// run as pods) and returns the exit status. GET /stats reports the counts.
func LedgerMain(args []string) int {
	fs := flag.NewFlagSet("ledger", flag.ContinueOnError)
	listen := fs.String("listen", ":8080", "address to serve on")
	customers := fs.Int("customers", 50000, "customers to bill")
	fenced := fs.Bool("fenced", true, "check fencing tokens")
	dir := fs.String("data", os.TempDir(), "directory for the database")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	l, err := StartLedger(*dir, *customers, *fenced, *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ledger:", err)
		return 1
	}
	fmt.Printf("ledger serving on %s (fenced: %v, customers: %d)\n", *listen, *fenced, *customers)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := l.Serve(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "ledger:", err)
		return 1
	}
	return 0
}
