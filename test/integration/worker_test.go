package integration

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/frontdesk-dev/frontdesk/pkg/fencing"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
	"github.com/frontdesk-dev/frontdesk/test/internal/harness"
)

// workerEnv makes the test binary run as a lock-holding worker process
// instead of running tests (see TestMain), so tests can freeze a real
// process with SIGSTOP.
const workerEnv = "FRONTDESK_TEST_WORKER"

// runWorker acquires the lock, then keeps writing to a fenced HTTP resource
// with its token, without checking its grant first (as a process that
// paused between its check and its write would). It reports on stdout.
func runWorker() int {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	var wf harness.WorkerFlags
	wf.Register(fs)
	identity := fs.String("identity", "", "")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	cfg, err := wf.RestConfig(0)
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	c, err := lock.New(cfg, lock.Config{Namespace: wf.Namespace, Name: wf.Lock, Identity: *identity})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g, err := c.Acquire(ctx)
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Printf("acquired %d\n", g.Token())
	go func() {
		<-g.Lost()
		fmt.Printf("lost: %v\n", context.Cause(g.Context()))
	}()
	for ctx.Err() == nil {
		req, _ := http.NewRequest(http.MethodPost, wf.URL, nil)
		req.Header.Set(fencing.TokenHeader, fmt.Sprint(g.Token()))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println("write error:", err)
		} else {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusConflict {
				fmt.Printf("write rejected %d %s\n", resp.StatusCode, strings.TrimSpace(string(body)))
			} else {
				fmt.Printf("write ok %d\n", resp.StatusCode)
			}
		}
		time.Sleep(100 * time.Millisecond) // the worker's pace, not a test assertion
	}
	return 0
}

// startWorker runs a worker process (runWorker) for lockName under
// identity, writing to url; it is killed when the test ends.
func startWorker(t *testing.T, namespace, lockName, identity, url string) *harness.Process {
	t.Helper()
	p, err := harness.StartProcess(identity, []string{os.Args[0], "--kubeconfig", kubeconfigPath, "--namespace", namespace,
		"--lock", lockName, "--identity", identity, "--url", url}, []string{workerEnv + "=1"}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p
}
