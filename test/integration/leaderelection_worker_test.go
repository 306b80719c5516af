package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/leaderelection"
)

// leaderWorkerEnv makes the test binary run as an operator process: a
// controller-runtime manager electing its leader through
// pkg/leaderelection (see TestMain).
const leaderWorkerEnv = "FRONTDESK_TEST_LEADER_WORKER"

// Election timings of the operator processes: short, so a takeover takes
// about three seconds, with room for a loaded machine's slow answers.
const (
	workerLeaseDuration = 3 * time.Second
	workerRenewDeadline = 2 * time.Second
	workerRetryPeriod   = 300 * time.Millisecond
)

// runLeaderWorker runs a controller-runtime manager with leader election on
// a Lease, through pkg/leaderelection. Its one runnable, started once this
// process leads, writes a fenced ConfigMap every 100ms with the token of
// its Term, and never checks the Term's Context first: it plays a leader
// that was paused between its check and its write, so every write it makes
// after losing the lead is one only the apiserver can refuse. The process
// exits when the manager returns (controller-runtime ends on a lost
// election), after the writer's next attempt: the test must see what the
// apiserver answered it. It reports on stdout, one line per event.
func runLeaderWorker() int {
	fs := flag.NewFlagSet("leader-worker", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "")
	namespace := fs.String("namespace", "", "")
	leaseName := fs.String("lease", "", "the election Lease, also the DistributedLock that fences the ConfigMap")
	identity := fs.String("identity", "", "")
	configMap := fs.String("configmap", "", "")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	logOut := io.Discard
	if os.Getenv("FRONTDESK_TEST_LOGS") != "" {
		logOut = os.Stderr
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(logOut), zap.UseDevMode(true)))
	klog.SetLogger(ctrl.Log.WithName("klog"))

	rc, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	lk, err := leaderelection.NewForConfig(rc, leaderelection.Config{
		Namespace: *namespace, Name: *leaseName, Identity: *identity, RenewDeadline: workerRenewDeadline,
	})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	mgr, err := ctrl.NewManager(rc, ctrl.Options{
		Scheme:                              clientgoscheme.Scheme,
		LeaderElection:                      true,
		LeaderElectionID:                    *leaseName,
		LeaderElectionNamespace:             *namespace,
		LeaderElectionResourceLockInterface: lk,
		LeaseDuration:                       new(workerLeaseDuration),
		RenewDeadline:                       new(workerRenewDeadline),
		RetryPeriod:                         new(workerRetryPeriod),
		Metrics:                             metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:              "0",
	})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	configMaps := kubernetes.NewForConfigOrDie(rc).CoreV1().ConfigMaps(*namespace)

	var (
		stopped    atomic.Bool
		term       atomic.Pointer[leaderelection.Term]
		writerDone = make(chan struct{})
	)
	write := func(token int64, seq int) {
		patch, err := json.Marshal(map[string]any{
			"metadata": map[string]any{"labels": fencedLabels, "annotations": map[string]string{
				locksv1alpha1.FencingLockAnnotation: *leaseName, locksv1alpha1.FencingTokenAnnotation: strconv.FormatInt(token, 10)}},
			"data": map[string]string{"writer": *identity, "token": strconv.FormatInt(token, 10), "seq": strconv.Itoa(seq)},
		})
		if err == nil {
			_, err = configMaps.Patch(context.Background(), *configMap, types.MergePatchType, patch, metav1.PatchOptions{})
		}
		switch {
		case err == nil:
			fmt.Printf("write ok token %d seq %d\n", token, seq)
		case strings.Contains(err.Error(), "stale fencing token"):
			fmt.Printf("write refused token %d seq %d: %v\n", token, seq, err)
		default:
			fmt.Printf("write error token %d seq %d: %v\n", token, seq, err)
		}
	}
	err = mgr.Add(manager.RunnableFunc(func(ctx context.Context) error { // needs leader election: started once leading
		t, err := lk.WaitForTerm(ctx)
		if err != nil {
			return nil //nolint:nilerr // no term: the manager is stopping, which is not this runnable failing
		}
		term.Store(t)
		fmt.Printf("leading token %d\n", t.Token())
		go func() {
			<-t.Context().Done()
			fmt.Printf("term ended: %v\n", context.Cause(t.Context()))
		}()
		go func() {
			defer close(writerDone)
			for seq := 1; ; seq++ {
				last := stopped.Load()
				write(t.Token(), seq)
				if last {
					return
				}
				time.Sleep(100 * time.Millisecond) // the operator's pace, not a test assertion
			}
		}()
		<-ctx.Done()
		return nil
	}))
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Println("manager starting")
	err = mgr.Start(context.Background())
	stopped.Store(true)
	fmt.Printf("manager stopped: %v\n", err)
	if t := term.Load(); t != nil {
		fmt.Printf("term at exit: %v\n", context.Cause(t.Context()))
		select {
		case <-writerDone:
		case <-time.After(5 * time.Second):
			fmt.Println("writer still busy at exit")
		}
	}
	return 1
}

// leaderWorker is a running operator process and the lines it printed.
type leaderWorker struct {
	cmd    *exec.Cmd
	stderr bytes.Buffer
	done   chan struct{}
	mu     sync.Mutex
	lines  []string
	at     []time.Time // when each line was read
}

func startLeaderWorker(t *testing.T, namespace, leaseName, identity, configMap string) *leaderWorker {
	t.Helper()
	cmd := exec.Command(os.Args[0], "--kubeconfig", kubeconfigPath, "--namespace", namespace,
		"--lease", leaseName, "--identity", identity, "--configmap", configMap)
	cmd.Env = append(os.Environ(), leaderWorkerEnv+"=1")
	w := &leaderWorker{cmd: cmd, done: make(chan struct{})}
	cmd.Stderr = &w.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			w.mu.Lock()
			w.lines = append(w.lines, sc.Text())
			w.at = append(w.at, time.Now())
			w.mu.Unlock()
		}
		_ = cmd.Wait()
		close(w.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-w.done
		if t.Failed() {
			t.Logf("%s printed:\n%s\nstderr:\n%s", identity, strings.Join(w.since(0), "\n"), w.stderr.String())
		}
	})
	return w
}

// since returns the lines printed after the first n.
func (w *leaderWorker) since(n int) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.lines[min(n, len(w.lines)):]...)
}

// firstAt is when the first line after the first n that starts with prefix
// was read, and the zero time if there is none.
func (w *leaderWorker) firstAt(n int, prefix string) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := n; i < len(w.lines); i++ {
		if strings.HasPrefix(w.lines[i], prefix) {
			return w.at[i]
		}
	}
	return time.Time{}
}

func (w *leaderWorker) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.lines)
}

// waitFor waits until a line starting with prefix is printed and returns it.
func (w *leaderWorker) waitFor(t *testing.T, prefix string, timeout time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, l := range w.since(0) {
			if strings.HasPrefix(l, prefix) {
				return l
			}
		}
		time.Sleep(10 * time.Millisecond) // polling the output; the deadline is the assertion
	}
	t.Fatalf("no line %q within %s", prefix, timeout)
	return ""
}

// linesWith returns the lines that start with prefix.
func linesWith(lines []string, prefix string) []string {
	var out []string
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return out
}
