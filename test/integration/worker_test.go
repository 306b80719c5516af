package integration

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/frontdesk-dev/frontdesk/pkg/fencing"
	testutil "github.com/frontdesk-dev/frontdesk/test/util"
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
	var wf testutil.WorkerFlags
	wf.Register(fs)
	identity := fs.String("identity", "", "")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	c, err := wf.Client(*identity, 0)
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

// worker is a running worker process and the lines it printed.
type worker struct {
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []string
}

func startWorker(t *testing.T, namespace, lockName, identity, url string) *worker {
	t.Helper()
	cmd := exec.Command(os.Args[0], "--kubeconfig", kubeconfigPath, "--namespace", namespace,
		"--lock", lockName, "--identity", identity, "--url", url)
	cmd.Env = append(os.Environ(), workerEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &worker{cmd: cmd}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			w.mu.Lock()
			w.lines = append(w.lines, sc.Text())
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return w
}

// linesWith returns the printed lines that start with prefix.
func (w *worker) linesWith(prefix string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, l := range w.lines {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return out
}

func (w *worker) output() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.lines, "\n")
}
