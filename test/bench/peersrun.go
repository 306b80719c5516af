package bench

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/localrun"
	"github.com/frontdesk-dev/frontdesk/pkg/fencing"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// PeersOptions size the side-by-side run.
type PeersOptions struct {
	// AssetsDir holds kube-apiserver, etcd and kubectl.
	AssetsDir string
	// TTL is every system's lease duration (whole seconds).
	TTL time.Duration
	// Iterations of uncontended acquire+release per system.
	Iterations int
	// Throughput is how long each throughput point runs.
	Throughput time.Duration
	// Locks are the numbers of independent locks for throughput.
	Locks []int
	// Handoffs measured with 10 waiters.
	Handoffs int
	// FailoverTrials is the number of SIGKILLed holders per system.
	FailoverTrials int
	// ProofTrials is the number of frontdesk holders proven dead (their
	// pod reported Failed, as a kubelet would: see proof.go); 0 skips it.
	ProofTrials int
	// HolderCommand runs a holder process (this binary in holder mode).
	HolderCommand []string
	// HolderEnv is added to the holder processes' environment.
	HolderEnv []string
}

// PeerRow is one system's results.
type PeerRow struct {
	System     string
	Uncontend  Row
	Throughput map[int]float64 // locks -> acquire+release per second
	Handoff    Row
	Failover   Row
	// ProofFailover is frontdesk's failover on proof (proofFailover);
	// empty for the other systems.
	ProofFailover Row
	Note          string
}

// RunPeers measures frontdesk, the raw Lease CAS, etcd's Mutex on the etcd
// that backs the apiserver, and Redis (if redis-server is installed) in one
// run with equal TTLs, and prints one table.
func RunPeers(ctx context.Context, opts PeersOptions, out io.Writer) ([]PeerRow, error) {
	pe, stop, err := startPeersEnv(ctx, opts, "frontdesk-peers-")
	if err != nil {
		return nil, err
	}
	defer stop()
	ttlSeconds := int(opts.TTL / time.Second)
	systems := []lockSystem{rawCASSystem{cs: pe.cs}, frontdeskSystem{cs: pe.cs, dyn: pe.dyn}, etcdSystem{endpoint: pe.env.ControlPlane.EtcdURL(), ttl: ttlSeconds}}
	redisAddr, stopRedis, redisErr := startRedis(pe.dir)
	if redisErr == nil {
		defer stopRedis()
		systems = append(systems, redisSystem{addr: redisAddr, ttl: opts.TTL})
	}
	holderArgs := []string{"--kubeconfig", pe.kubeconfig, "--etcd", pe.env.ControlPlane.EtcdURL(), "--redis", redisAddr, "--ttl", opts.TTL.String()}

	var rows []PeerRow
	for _, sys := range systems {
		row, err := measurePeer(ctx, sys, opts, holderArgs)
		if _, isFrontdesk := sys.(frontdeskSystem); err == nil && isFrontdesk && opts.ProofTrials > 0 {
			// Beside its failover after the lease, at the same TTL.
			row.ProofFailover, err = proofFailover(ctx, pe, opts, holderArgs)
		}
		if err != nil {
			return rows, fmt.Errorf("%s: %w", sys.name(), err)
		}
		rows = append(rows, row)
	}
	if redisErr != nil {
		rows = append(rows, PeerRow{System: "Redis SET NX PX", Note: "skipped: " + redisErr.Error()})
	}
	printPeers(out, rows, opts)
	return rows, nil
}

// peersEnv is the control plane of a peers or failover run, with the
// manager running against it and the admin's clients.
type peersEnv struct {
	env *localrun.Environment
	cs  kubernetes.Interface
	dyn dynamic.Interface
	// dir is the run's temporary directory: the admin kubeconfig (the
	// holder processes read it), the tokens of the proof trials' holders.
	dir, kubeconfig string
}

// startPeersEnv starts a control plane with the manager and creates what
// every system measured needs (setupPeerLocks). stop stops it all and
// removes its directory.
func startPeersEnv(ctx context.Context, opts PeersOptions, prefix string) (pe *peersEnv, stop func(), err error) {
	pe = &peersEnv{}
	if pe.dir, err = os.MkdirTemp("", prefix); err != nil {
		return nil, nil, err
	}
	pe.kubeconfig = filepath.Join(pe.dir, "kubeconfig")
	pe.env, err = localrun.StartEnvironment(ctx, localrun.EnvironmentOptions{AssetsDir: opts.AssetsDir, KubeconfigPath: pe.kubeconfig, MetricsBindAddress: "0"})
	if err != nil {
		_ = os.RemoveAll(pe.dir)
		return nil, nil, err
	}
	stop = func() { _ = pe.env.Stop(); _ = os.RemoveAll(pe.dir) }
	if pe.cs, err = kubernetes.NewForConfig(lock.ProtobufConfig(pe.env.ControlPlane.Config)); err == nil {
		if pe.dyn, err = dynamic.NewForConfig(pe.env.ControlPlane.Config); err == nil {
			err = setupPeerLocks(ctx, pe.cs, pe.env, opts)
		}
	}
	if err != nil {
		stop()
		return nil, nil, err
	}
	return pe, stop, nil
}

// setupPeerLocks creates the DistributedLocks every system's keys name
// (the Lease-based systems need them; etcd and Redis just use the names).
func setupPeerLocks(ctx context.Context, cs kubernetes.Interface, env *localrun.Environment, opts PeersOptions) error {
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	names := []string{"solo", "handoff"}
	for i := range max(slicesMax(opts.Locks), 1) {
		names = append(names, fmt.Sprintf("tp-%d", i))
	}
	for i := range opts.FailoverTrials {
		names = append(names, fmt.Sprintf("failover-%d", i))
	}
	for i := range opts.ProofTrials {
		names = append(names, proofLock(i))
	}
	if opts.ProofTrials > 0 {
		names = append(names, leaseGuardProbe) // proofFailover installs the lease guard
	}
	for _, n := range names {
		l := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Name: n, Namespace: namespace},
			Spec: locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: int32(opts.TTL / time.Second)}}
		if err := env.Client.Create(ctx, l); err != nil {
			return err
		}
	}
	if err := env.WaitReady(ctx, namespace, names); err != nil {
		return err
	}
	if opts.ProofTrials > 0 {
		return setupProofHolders(ctx, env, cs)
	}
	return nil
}

func slicesMax(xs []int) int {
	m := 0
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

func measurePeer(ctx context.Context, sys lockSystem, opts PeersOptions, holderArgs []string) (PeerRow, error) {
	row := PeerRow{System: sys.name(), Throughput: map[int]float64{}}
	c, err := sys.newClient("solo-client")
	if err != nil {
		return row, err
	}
	defer c.close()
	samples := make([]time.Duration, 0, opts.Iterations)
	for i := range opts.Iterations + opts.Iterations/10 {
		start := time.Now()
		_, release, err := c.acquire(ctx, "solo")
		if err != nil {
			return row, err
		}
		if err := release(ctx); err != nil {
			return row, err
		}
		if i >= opts.Iterations/10 {
			samples = append(samples, time.Since(start))
		}
	}
	row.Uncontend = sorted(Row{Samples: samples})
	for _, n := range opts.Locks {
		if row.Throughput[n], err = throughput(ctx, sys, n, opts.Throughput); err != nil {
			return row, err
		}
	}
	if _, isRaw := sys.(rawCASSystem); isRaw {
		row.Note = "no waiting or expiry: uncontended floor only"
		return row, nil
	}
	h, err := handoff(ctx, sys, "handoff", 10, &everyHandoff{n: opts.Handoffs})
	if err != nil {
		return row, err
	}
	row.Handoff = h.fromDone
	if row.Failover, err = failover(ctx, sys, opts, holderArgs); err != nil {
		return row, err
	}
	return row, nil
}

// throughput runs n clients, each on its own lock, acquiring and releasing
// for d, and returns the total rate.
func throughput(ctx context.Context, sys lockSystem, n int, d time.Duration) (float64, error) {
	var ops atomic.Int64
	errs := make(chan error, n)
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for i := range n {
		c, err := sys.newClient(fmt.Sprintf("tp-client-%d", i))
		if err != nil {
			return 0, err
		}
		wg.Go(func() {
			defer c.close()
			for time.Now().Before(deadline) {
				_, release, err := c.acquire(ctx, fmt.Sprintf("tp-%d", i))
				if err == nil {
					err = release(ctx)
				}
				if err != nil {
					errs <- err
					return
				}
				ops.Add(1)
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		return 0, err
	default:
	}
	return float64(ops.Load()) / d.Seconds(), nil
}

// handoffRows are the two latencies of each handoff: from the holder's
// Release returning (the lock is free), and from its call (the release
// write included), to the next holder's Acquire returning.
type handoffRows struct {
	fromDone, fromStart Row
	// arriving is fromStart for the handoffs the pacer did not measure:
	// while waiters were still joining the queue. Not counted in the
	// others.
	arriving Row
}

// handoffHold is how long each holder keeps the lock in the handoff
// measurement before releasing it (not part of the latency measured).
const handoffHold = 100 * time.Millisecond

// handoff: waiters+1 clients on lock key; each holder holds a moment
// (handoffHold), waits until pace lets it release, releases, and waits for
// the next grant before queueing again, so every handoff goes to a waiter
// already queued. It returns once pace says the measurement is over, or
// ctx ends.
func handoff(ctx context.Context, sys lockSystem, key string, waiters int, pace handoffPacer) (handoffRows, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	base := time.Now()
	var releaseStarted, releaseDone, grants atomic.Int64 // times since base; 0 = no release yet
	var measuredRelease atomic.Bool                      // the last release started a measured handoff
	var mu sync.Mutex
	var fromStart, fromDone, arriving []time.Duration
	errs := make(chan error, waiters+1)
	var wg sync.WaitGroup
	for i := range waiters + 1 {
		c, err := sys.newClient(fmt.Sprintf("waiter-%d", i))
		if err != nil {
			return handoffRows{}, err
		}
		wg.Go(func() {
			defer c.close()
			for ctx.Err() == nil {
				_, release, err := c.acquire(ctx, key)
				if err != nil {
					if ctx.Err() == nil {
						errs <- err
						cancel()
					}
					return
				}
				now := time.Since(base)
				got := grants.Add(1)
				if started := releaseStarted.Load(); started != 0 && ctx.Err() == nil {
					// A release that hands the lock on in its own write can
					// have the next holder hold before it returns: 0.
					sinceDone := time.Duration(0)
					if done := releaseDone.Load(); done >= started {
						sinceDone = max(now-time.Duration(done), 0)
					}
					mu.Lock()
					if measuredRelease.Load() {
						fromStart = append(fromStart, now-time.Duration(started))
						fromDone = append(fromDone, sinceDone)
						if pace.record() {
							cancel()
						}
					} else {
						arriving = append(arriving, now-time.Duration(started))
					}
					mu.Unlock()
				}
				// Hold a moment, as holders do, so that the waiters (the
				// previous holder included) are queued before the release:
				// a hand-off to a waiter, in every system measured.
				time.Sleep(handoffHold)
				measured, err := pace.await(ctx)
				if err != nil {
					_ = release(context.Background())
					return
				}
				measuredRelease.Store(measured)
				releaseDone.Store(0)
				releaseStarted.Store(int64(time.Since(base)))
				if err := release(context.Background()); err != nil {
					errs <- err
					cancel()
					return
				}
				releaseDone.Store(int64(time.Since(base)))
				for grants.Load() == got && ctx.Err() == nil {
					time.Sleep(time.Millisecond) // let a waiter take it before queueing again
				}
			}
		})
		if i == 0 {
			for grants.Load() == 0 && ctx.Err() == nil { // the first holder, before the others queue
				time.Sleep(time.Millisecond)
			}
		}
	}
	wg.Wait()
	select {
	case err := <-errs:
		return handoffRows{}, err
	default:
	}
	return handoffRows{fromDone: sorted(Row{Samples: fromDone}), fromStart: sorted(Row{Samples: fromStart}),
		arriving: sorted(Row{Samples: arriving})}, nil
}

// failover: a holder process takes the lock and keeps it (renewing where
// the system renews); a waiter queues; the holder is SIGKILLed; measured
// from the kill to the waiter's first write accepted by a fencing Guard.
func failover(ctx context.Context, sys lockSystem, opts PeersOptions, holderArgs []string) (Row, error) {
	var samples []time.Duration
	for trial := range opts.FailoverTrials {
		key := fmt.Sprintf("failover-%d", trial)
		d, err := failoverOnce(ctx, sys, key, opts, holderArgs)
		if err != nil {
			return Row{}, fmt.Errorf("failover trial %d: %w", trial, err)
		}
		samples = append(samples, d)
	}
	return sorted(Row{Samples: samples}), nil
}

// failoverOnce: one trial of failover on key.
func failoverOnce(ctx context.Context, sys lockSystem, key string, opts PeersOptions, holderArgs []string) (time.Duration, error) {
	holder, err := startHolder(sys, key, opts, holderArgs)
	if err != nil {
		return 0, err
	}
	defer stopHolder(holder)
	next, err := awaitNext(ctx, sys, key, opts)
	if err != nil {
		return 0, err
	}
	time.Sleep(200 * time.Millisecond) // the waiter is queued before the crash
	killed := time.Now()
	if err := holder.Process.Signal(syscall.SIGKILL); err != nil {
		return 0, err
	}
	r := <-next
	if r.err != nil {
		return 0, r.err
	}
	return r.fenced.Sub(killed), nil
}

// startHolder starts a holder process of sys on key (holderArgs added to
// its command line) and returns it once it printed that it holds the lock.
func startHolder(sys lockSystem, key string, opts PeersOptions, holderArgs []string) (*exec.Cmd, error) {
	args := append(append(append([]string{}, opts.HolderCommand[1:]...), holderArgs...), "--system", sys.name(), "--key", key)
	holder := exec.Command(opts.HolderCommand[0], args...)
	holder.Env = append(os.Environ(), opts.HolderEnv...)
	holder.Stderr = os.Stderr
	out, err := holder.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := holder.Start(); err != nil {
		return nil, err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "held") {
		stopHolder(holder)
		return nil, fmt.Errorf("holder did not take the lock: %q %v", line, err) //nolint:errorlint // err is nil when the line is wrong; %w would print %!w(<nil>)
	}
	return holder, nil
}

// stopHolder kills the holder process, if it still runs, and waits for it.
func stopHolder(holder *exec.Cmd) {
	_ = holder.Process.Kill()
	_ = holder.Wait()
}

// nextHolder is when the waiter of a failover trial held the lock (its
// Acquire returned), and when its first write was accepted by a fencing
// Guard right after.
type nextHolder struct {
	held, fenced time.Time
	err          error
}

// awaitNext starts a waiter of sys on key, blocked in acquire, and returns
// the channel its nextHolder arrives on; it releases the lock once it held
// it, and gives up after 10 TTLs and 30 s.
func awaitNext(ctx context.Context, sys lockSystem, key string, opts PeersOptions) (<-chan nextHolder, error) {
	c, err := sys.newClient("failover-waiter")
	if err != nil {
		return nil, err
	}
	guard := fencing.NewMemoryGuard()
	next := make(chan nextHolder, 1)
	go func() {
		defer c.close()
		wctx, cancel := context.WithTimeout(ctx, 10*opts.TTL+30*time.Second)
		defer cancel()
		token, release, err := c.acquire(wctx, key)
		if err != nil {
			next <- nextHolder{err: err}
			return
		}
		r := nextHolder{held: time.Now()}
		r.err = guard.Fence(wctx, key, token, func(context.Context) error { return nil })
		r.fenced = time.Now()
		_ = release(context.Background())
		next <- r
	}()
	return next, nil
}

// HolderMain is the holder process of the failover measurement: it takes
// the lock, prints "held", and keeps it until it is killed.
func HolderMain(args []string) int {
	fs := flag.NewFlagSet("peer-holder", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "")
	etcd := fs.String("etcd", "", "")
	redisAddr := fs.String("redis", "", "")
	ttl := fs.Duration("ttl", 2*time.Second, "")
	system := fs.String("system", "", "")
	key := fs.String("key", "", "")
	tokenFile := fs.String("token-file", "", "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var sys lockSystem
	switch *system {
	case "frontdesk":
		var err error
		if sys, err = frontdeskHolder(*kubeconfig, *tokenFile); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	case "etcd Mutex":
		sys = etcdSystem{endpoint: *etcd, ttl: int(*ttl / time.Second)}
	case "Redis SET NX PX":
		sys = redisSystem{addr: *redisAddr, ttl: *ttl}
	default:
		fmt.Fprintf(os.Stderr, "unknown system %q\n", *system)
		return 2
	}
	c, err := sys.newClient("failover-holder")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	token, _, err := c.acquire(context.Background(), *key)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("held %d\n", token)
	select {} // hold, renewing in the background, until SIGKILL
}

// frontdeskHolder is the frontdesk system of a holder process: the
// kubeconfig's apiserver, as its admin or, with tokenFile, as the bearer of
// the token in that file alone (a pod's bound token: see proof.go).
func frontdeskHolder(kubeconfig, tokenFile string) (lockSystem, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	if tokenFile != "" {
		token, err := os.ReadFile(tokenFile)
		if err != nil {
			return nil, err
		}
		cfg = rest.AnonymousClientConfig(cfg)
		cfg.BearerToken = strings.TrimSpace(string(token))
	}
	cs, err := kubernetes.NewForConfig(lock.ProtobufConfig(cfg))
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return frontdeskSystem{cs: cs, dyn: dyn}, nil
}

// startRedis starts redis-server on a free loopback port, without
// persistence. It fails with a clear error when redis-server is missing.
func startRedis(dir string) (string, func(), error) {
	path, err := exec.LookPath("redis-server")
	if err != nil {
		return "", nil, fmt.Errorf("redis-server not found (Debian package redis-server; `make bench` installs it where it can)")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(path, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("starting redis-server: %w", err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return addr, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("redis-server did not start on %s", addr)
		}
		time.Sleep(50 * time.Millisecond) // waiting for the server to listen
	}
}

func printPeers(out io.Writer, rows []PeerRow, opts PeersOptions) {
	fmt.Fprintf(out, "\npeers, one run, TTL %s for every system (ops/s: acquire+release per second in all)\n\n", opts.TTL)
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	var header strings.Builder
	header.WriteString("system\tacq+rel p50\tp99\t")
	for _, n := range opts.Locks {
		fmt.Fprintf(&header, "%d locks\t", n)
	}
	header.WriteString("handoff(10) p50\tp99\tfailover p50\tp99\tmax\tn\tnote\t")
	fmt.Fprintln(w, header.String())
	dash := func(r Row, p float64) string {
		if len(r.Samples) == 0 {
			return "-"
		}
		return ms(r.Percentile(p))
	}
	for _, r := range rows {
		var line strings.Builder
		fmt.Fprintf(&line, "%s\t%s\t%s\t", r.System, dash(r.Uncontend, 50), dash(r.Uncontend, 99))
		for _, n := range opts.Locks {
			if v, ok := r.Throughput[n]; ok {
				fmt.Fprintf(&line, "%.0f/s\t", v)
			} else {
				line.WriteString("-\t")
			}
		}
		fmt.Fprintf(&line, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t", dash(r.Handoff, 50), dash(r.Handoff, 99),
			dash(r.Failover, 50), dash(r.Failover, 99), dash(r.Failover, 100), len(r.Failover.Samples), r.Note)
		fmt.Fprintln(w, line.String())
	}
	_ = w.Flush()
	for _, r := range rows {
		if len(r.ProofFailover.Samples) > 0 {
			printProofFailover(out, r.ProofFailover, opts)
		}
	}
}

// FailoverRows are RunFailover's measurements: frontdesk's failover after
// the lease, and on proof.
type FailoverRows struct {
	// Lease: a holder process SIGKILLed while a waiter is queued, from the
	// kill to the waiter's first write accepted by a fencing Guard.
	Lease Row
	// Proof: a holder proven dead, from its pod's status write to the
	// waiter's grant (proofFailover); empty with no ProofTrials.
	Proof Row
}

// RunFailover measures frontdesk's failover alone, at opts.TTL: after the
// lease, opts.FailoverTrials times, and on proof, opts.ProofTrials times.
// It prints p50, p99 and the slowest of each, and returns the rows.
func RunFailover(ctx context.Context, opts PeersOptions, out io.Writer) (FailoverRows, error) {
	var rows FailoverRows
	pe, stop, err := startPeersEnv(ctx, opts, "frontdesk-failover-")
	if err != nil {
		return rows, err
	}
	defer stop()
	holderArgs := []string{"--kubeconfig", pe.kubeconfig, "--ttl", opts.TTL.String()}
	if rows.Lease, err = failover(ctx, frontdeskSystem{cs: pe.cs, dyn: pe.dyn}, opts, holderArgs); err != nil {
		return rows, err
	}
	fmt.Fprintf(out, "frontdesk failover after a SIGKILLed holder, lease %s: p50 %s, p99 %s, max %s, n %d\n",
		opts.TTL, ms(rows.Lease.Percentile(50)), ms(rows.Lease.Percentile(99)), ms(rows.Lease.Percentile(100)), len(rows.Lease.Samples))
	if opts.ProofTrials > 0 {
		if rows.Proof, err = proofFailover(ctx, pe, opts, holderArgs); err != nil {
			return rows, err
		}
		printProofFailover(out, rows.Proof, opts)
	}
	return rows, nil
}
