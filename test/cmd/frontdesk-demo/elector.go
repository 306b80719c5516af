package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	clientgole "k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/frontdesk-dev/frontdesk/pkg/fencing"
	"github.com/frontdesk-dev/frontdesk/pkg/leaderelection"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// The elector's timing: controller-runtime's defaults, with a lock of
// leaseDurationSeconds 15.
const (
	electorLeaseDuration = 15 * time.Second
	electorRenewDeadline = 10 * time.Second
	electorRetryPeriod   = 2 * time.Second
)

// electorOptions are the flags of `frontdesk-demo elector`.
type electorOptions struct {
	namespace, lease, store, writer string
	stock                           bool
}

// electorMain is `frontdesk-demo elector`: one replica of an operator, a
// candidate of client-go's leader election on the Lease of a
// DistributedLock, in its pod with the pod's ServiceAccount token. As
// leader it writes to the fenced store (`frontdesk-demo store`) with its
// fencing token at once, then every second, while it leads. With --stock
// it elects on client-go's own resourcelock.LeaseLock and reads its token
// back from the Lease (spec.leaseTransitions); else on pkg/leaderelection's
// Lock, whose Term knows it. On SIGUSR1 it allocates memory until the OOM
// killer ends it (the container's memory limit). It returns the exit
// status: 0 after SIGTERM, 75 when it lost the lead otherwise.
func electorMain(args []string) int {
	var o electorOptions
	fs := flag.NewFlagSet("elector", flag.ContinueOnError)
	fs.StringVar(&o.namespace, "namespace", "", "namespace of the election Lease")
	fs.StringVar(&o.lease, "lease", "", "the election Lease, and the DistributedLock over it")
	fs.StringVar(&o.store, "store", "", "base URL of the fenced store")
	fs.StringVar(&o.writer, "writer", os.Getenv("POD_NAME"), "the writer's name in the store's records")
	fs.BoolVar(&o.stock, "stock", false, "elect with client-go's resourcelock.LeaseLock, not pkg/leaderelection")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	go oomOnSIGUSR1()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	rc, err := rest.InClusterConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "elector:", err)
		return 1
	}
	identity := lock.DefaultIdentity()
	lk, lead, err := electionLock(rc, o, identity)
	if err != nil {
		fmt.Fprintln(os.Stderr, "elector:", err)
		return 1
	}
	elector, err := clientgole.NewLeaderElector(clientgole.LeaderElectionConfig{
		Lock: lk, Name: o.lease, ReleaseOnCancel: true,
		LeaseDuration: electorLeaseDuration, RenewDeadline: electorRenewDeadline, RetryPeriod: electorRetryPeriod,
		Callbacks: clientgole.LeaderCallbacks{
			OnStartedLeading: lead,
			OnStoppedLeading: func() { fmt.Println("stopped leading") },
			OnNewLeader:      func(id string) { fmt.Printf("the leader is %s\n", id) },
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "elector:", err)
		return 1
	}
	fmt.Printf("candidate %s (stock client-go lock: %v) on Lease %s/%s\n", identity, o.stock, o.namespace, o.lease)
	elector.Run(ctx)
	if ctx.Err() == nil {
		return 75
	}
	return 0
}

// electionLock is the elector's resourcelock and what it does while
// leading: pkg/leaderelection's Lock, each Term's writes with its token; or
// (stock) client-go's LeaseLock, the token read back from the Lease it won.
func electionLock(rc *rest.Config, o electorOptions, identity string) (resourcelock.Interface, func(context.Context), error) {
	if !o.stock {
		lk, err := leaderelection.NewForConfig(rc, leaderelection.Config{
			Namespace: o.namespace, Name: o.lease, Identity: identity, RenewDeadline: electorRenewDeadline,
		})
		if err != nil {
			return nil, nil, err
		}
		return lk, func(leading context.Context) {
			for {
				term, err := lk.WaitForTerm(leading)
				if err != nil {
					return
				}
				writeWhileLeading(term.Context(), o, term.Token())
			}
		}, nil
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, err
	}
	lk := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: o.namespace, Name: o.lease},
		Client:     cs.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: identity},
	}
	return lk, func(leading context.Context) {
		for leading.Err() == nil {
			rec, _, err := lk.Get(leading)
			if err == nil && rec.HolderIdentity == identity {
				writeWhileLeading(leading, o, int64(rec.LeaderTransitions))
				return
			}
			fmt.Printf("reading the token back from the Lease: %v\n", err)
			time.Sleep(100 * time.Millisecond)
		}
	}, nil
}

// writeWhileLeading writes to the store with token at once and then every
// second, until ctx (the leadership, or the Term) ends.
func writeWhileLeading(ctx context.Context, o electorOptions, token int64) {
	fmt.Printf("leading with fencing token %d\n", token)
	hc := &http.Client{Timeout: 2 * time.Second}
	target := o.store + "/write?writer=" + url.QueryEscape(o.writer)
	for ctx.Err() == nil {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, nil)
		if err != nil {
			fmt.Println("write:", err)
			return
		}
		req.Header.Set(fencing.TokenHeader, strconv.FormatInt(token, 10))
		pause := time.Second
		resp, err := hc.Do(req)
		if err != nil {
			fmt.Printf("write with fencing token %d: %v\n", token, err)
			pause = 100 * time.Millisecond
		} else {
			_ = resp.Body.Close()
			fmt.Printf("write with fencing token %d: %s\n", token, resp.Status)
		}
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
	}
}

// oomOnSIGUSR1 waits for SIGUSR1, then allocates and touches memory until
// the OOM killer ends the process: at most 512 MiB, so that a cluster that
// enforces no memory limit is not starved.
func oomOnSIGUSR1() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR1)
	<-ch
	fmt.Println("SIGUSR1: allocating memory until the OOM killer ends this process")
	held := make([][]byte, 0, 128)
	for range 128 {
		b := make([]byte, 4<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		held = append(held, b)
	}
	fmt.Println("still alive with 512 MiB more: no memory limit was enforced")
	runtime.KeepAlive(held)
}
