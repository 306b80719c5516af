// Command sql-worker holds a frontdesk lock with pkg/lock and, while it
// holds it, appends entries to a SQL table through pkg/fencing's SQLGuard:
// each write is one transaction that first checks the grant's fencing token
// against the highest the database has accepted for the grant's fencing
// key. A worker that paused past its lease (and lost the lock to another)
// has its late writes refused by the database itself.
//
//	go run ./sql-worker --namespace default --lock billing --dsn 'file:ledger.db'
//
// Exit status: 0 when every entry was written and the lock released; 75
// when the lock was lost or a write was refused as stale (do not retry with
// the same grant: acquire again); 1 on any other error.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/frontdesk-dev/frontdesk/pkg/fencing"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// exitLost is the exit status when the lock was lost or a write refused.
const exitLost = 75

func main() { os.Exit(run()) }

func run() int {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then the in-cluster config)")
	namespace := flag.String("namespace", "", "namespace of the DistributedLock (default: the kubeconfig context's)")
	lockName := flag.String("lock", "billing", "name of the DistributedLock")
	dsn := flag.String("dsn", "file:ledger.db?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)",
		"the SQLite database (a modernc.org/sqlite data source name)")
	entries := flag.Int("entries", 3, "entries to write while holding the lock")
	interval := flag.Duration("interval", time.Second, "pause between two entries (the work a real job does between writes)")
	wait := flag.Duration("wait", time.Minute, "how long to wait for the lock")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := work(ctx, *kubeconfig, *namespace, *lockName, *dsn, *entries, *interval, *wait); err != nil {
		fmt.Fprintln(os.Stderr, "sql-worker:", err)
		if errors.Is(err, lock.ErrLost) || errors.Is(err, fencing.ErrStaleToken) {
			return exitLost
		}
		return 1
	}
	return 0
}

func work(ctx context.Context, kubeconfig, namespace, lockName, dsn string, entries int, interval, wait time.Duration) error {
	// 1. The database: the guard's table (EnsureSchema is idempotent: call
	// it at every start) and the table the worker writes.
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	guard, err := fencing.NewSQLGuard(db, "")
	if err != nil {
		return err
	}
	if err := guard.EnsureSchema(ctx); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS ledger (
		fencing_key TEXT NOT NULL, token INTEGER NOT NULL, holder TEXT NOT NULL, entry INTEGER NOT NULL)`); err != nil {
		return fmt.Errorf("creating table ledger: %w", err)
	}

	// 2. The lock: wait for it, at most wait.
	rc, namespace, err := clientConfig(kubeconfig, namespace)
	if err != nil {
		return err
	}
	c, err := lock.New(rc, lock.Config{Namespace: namespace, Name: lockName})
	if err != nil {
		return err
	}
	acquireCtx, cancel := context.WithTimeout(ctx, wait)
	g, err := c.Acquire(acquireCtx)
	cancel()
	if err != nil {
		return err
	}
	defer func() {
		if err := g.Release(context.Background()); err == nil {
			fmt.Println("released the lock")
		}
	}()
	fmt.Printf("holding lock %s as %s with fencing token %d (fencing key %s)\n", g.Lock(), g.Holder(), g.Token(), g.FencingKey())

	// 3. The work: every write fenced on the grant's key and token, in the
	// write's own transaction. The first one also tells the database this
	// token, so a holder before this one can no longer write: fence first,
	// then read what to work on.
	for entry := 1; entry <= entries; entry++ {
		if entry > 1 {
			select {
			case <-g.Context().Done(): // lost, or about to lapse: stop before the next write
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(interval):
			}
		}
		writeCtx := g.Context()
		if err := writeCtx.Err(); err != nil {
			return fmt.Errorf("stopping before entry %d: %w", entry, context.Cause(writeCtx))
		}
		err := guard.FenceTx(writeCtx, g.FencingKey(), g.Token(), func(tx *sql.Tx) error {
			_, err := tx.ExecContext(writeCtx, `INSERT INTO ledger (fencing_key, token, holder, entry) VALUES ($1, $2, $3, $4)`,
				g.FencingKey(), g.Token(), g.Holder(), entry)
			return err
		})
		if err != nil && writeCtx.Err() != nil {
			// The grant ended during the write (its context is what
			// cancelled it): say why, so a lost lock reads as lost.
			return fmt.Errorf("entry %d interrupted: %w", entry, context.Cause(writeCtx))
		}
		if err != nil {
			return fmt.Errorf("entry %d: %w", entry, err)
		}
		fmt.Printf("wrote entry %d with fencing token %d\n", entry, g.Token())
	}
	return nil
}

// clientConfig is the client configuration kubectl would use: the
// kubeconfig file given, else $KUBECONFIG, else ~/.kube/config, else the
// in-cluster configuration; and namespace, else the current context's
// namespace ("default" when it names none).
func clientConfig(kubeconfig, namespace string) (*rest.Config, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	overrides := &clientcmd.ConfigOverrides{Context: clientcmdapi.Context{Namespace: namespace}}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
	rc, err := cc.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("loading the client configuration: %w", err)
	}
	ns, _, err := cc.Namespace()
	if err != nil {
		return nil, "", fmt.Errorf("loading the namespace: %w", err)
	}
	return rc, ns, nil
}
