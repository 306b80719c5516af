// Command fenced-leader is an operator-style program: its replicas elect a
// leader with client-go's leader election, on the Lease of a frontdesk
// DistributedLock, through pkg/leaderelection, which tells the leader the
// fencing token of its term. The leader records what it does in a SQL table
// through pkg/fencing's SQLGuard, each write fenced on the Term's key and
// token: a leader that paused past its lease, while another replica took
// over, has its late writes refused by the database itself.
//
//	go run ./fenced-leader --namespace default --lease my-operator-lock --dsn 'file:operator.db'
//
// It runs until SIGTERM or SIGINT, then releases the Lease if it leads, so
// another replica takes over at once. Exit status: 0 after such a stop; 75
// when it lost the lead otherwise (client-go could not renew in time; a
// Deployment restarts it, as controller-runtime's managers exit too); 1 on
// any other error.
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
	clientgole "k8s.io/client-go/tools/leaderelection"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/frontdesk-dev/frontdesk/pkg/fencing"
	"github.com/frontdesk-dev/frontdesk/pkg/leaderelection"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// exitLost is the exit status when the lead was lost without a stop.
const exitLost = 75

type options struct {
	kubeconfig, namespace, lease, identity, dsn string
	interval                                    time.Duration
	leaseDuration, renewDeadline, retryPeriod   time.Duration
}

func main() { os.Exit(run()) }

func run() int {
	var o options
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then the in-cluster config)")
	flag.StringVar(&o.namespace, "namespace", "", "namespace of the election Lease (default: the kubeconfig context's)")
	flag.StringVar(&o.lease, "lease", "my-operator-lock", "the election Lease, and the DistributedLock over it")
	flag.StringVar(&o.identity, "identity", "", "this replica's identity, unique per process (default: lock.DefaultIdentity())")
	flag.StringVar(&o.dsn, "dsn", "file:operator.db?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)",
		"the SQLite database (a modernc.org/sqlite data source name)")
	flag.DurationVar(&o.interval, "interval", time.Second, "pause between two of the leader's writes")
	flag.DurationVar(&o.leaseDuration, "lease-duration", 15*time.Second, "the elector's LeaseDuration: the lock's leaseDurationSeconds")
	flag.DurationVar(&o.renewDeadline, "renew-deadline", 10*time.Second, "the elector's RenewDeadline")
	flag.DurationVar(&o.retryPeriod, "retry-period", 2*time.Second, "the elector's RetryPeriod")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := operate(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "fenced-leader:", err)
		if errors.Is(err, leaderelection.ErrLost) {
			return exitLost
		}
		return 1
	}
	return 0
}

func operate(ctx context.Context, o options) error {
	// 1. The database: the guard's table (EnsureSchema is idempotent: every
	// replica calls it at every start) and the table the leader writes.
	db, err := sql.Open("sqlite", o.dsn)
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
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS actions (
		fencing_key TEXT NOT NULL, token INTEGER NOT NULL, leader TEXT NOT NULL, seq INTEGER NOT NULL)`); err != nil {
		return fmt.Errorf("creating table actions: %w", err)
	}

	// 2. The election: client-go's, on a pkg/leaderelection Lock, which
	// never creates the Lease (frontdesk's controller does, for the lock).
	rc, namespace, err := clientConfig(o.kubeconfig, o.namespace)
	if err != nil {
		return err
	}
	if o.identity == "" {
		o.identity = lock.DefaultIdentity()
	}
	lk, err := leaderelection.NewForConfig(rc, leaderelection.Config{
		Namespace: namespace, Name: o.lease, Identity: o.identity, RenewDeadline: o.renewDeadline,
	})
	if err != nil {
		return err
	}
	var lost error
	elector, err := clientgole.NewLeaderElector(clientgole.LeaderElectionConfig{
		Lock:            lk,
		Name:            o.lease,
		LeaseDuration:   o.leaseDuration,
		RenewDeadline:   o.renewDeadline,
		RetryPeriod:     o.retryPeriod,
		ReleaseOnCancel: true, // on SIGTERM: hand over at once, not after the lease
		Callbacks: clientgole.LeaderCallbacks{
			OnStartedLeading: func(leading context.Context) { lead(leading, lk, guard, o.interval) },
			OnStoppedLeading: func() { // called by Run, also when this replica never led
				if ctx.Err() == nil {
					lost = fmt.Errorf("%w: client-go stopped leading", leaderelection.ErrLost)
				}
			},
			OnNewLeader: func(identity string) { fmt.Printf("the leader is %s\n", identity) },
		},
	})
	if err != nil {
		return err
	}
	fmt.Printf("replica %s electing on Lease %s/%s\n", o.identity, namespace, o.lease)
	elector.Run(ctx) // returns when ctx ends, or when this replica stops leading
	return lost
}

// lead is the leader's work, while leading lasts: one fenced write per
// interval, each with the current Term's key and token.
func lead(leading context.Context, lk *leaderelection.Lock, guard *fencing.SQLGuard, interval time.Duration) {
	defer fmt.Println("no longer leading")
	for {
		term, err := lk.WaitForTerm(leading)
		if err != nil {
			return // leading ended
		}
		fmt.Printf("leading with fencing token %d (fencing key %s)\n", term.Token(), term.FencingKey())
		// The Term's first write tells the database its token, so an earlier
		// leader can no longer write: fence first, then read what to act on.
		for seq := 1; term.Err() == nil; seq++ {
			err := guard.FenceTx(term.Context(), term.FencingKey(), term.Token(), func(tx *sql.Tx) error {
				if err := term.Err(); err != nil { // right before the write: it reads the clock itself
					return err
				}
				_, err := tx.ExecContext(term.Context(), `INSERT INTO actions (fencing_key, token, leader, seq) VALUES ($1, $2, $3, $4)`,
					term.FencingKey(), term.Token(), lk.Identity(), seq)
				return err
			})
			if err != nil {
				fmt.Printf("action %d with fencing token %d not written: %v\n", seq, term.Token(), err)
			} else {
				fmt.Printf("wrote action %d with fencing token %d\n", seq, term.Token())
			}
			select {
			case <-leading.Done():
				return
			case <-term.Context().Done():
			case <-time.After(interval):
			}
		}
		fmt.Printf("term with fencing token %d ended: %v\n", term.Token(), term.Err())
	}
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
