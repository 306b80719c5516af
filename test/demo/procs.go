package demo

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// workerProc is a running worker process and the last state it reported.
type workerProc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}

	mu     sync.Mutex
	state  string
	token  int64
	frozen bool
	lost   bool
}

// startWorker launches a worker process with the demo's worker command.
func startWorker(opts Options, name, kubeconfig, ledgerURL string) (*workerProc, error) {
	args := append(append([]string{}, opts.WorkerCommand[1:]...),
		"--kubeconfig", kubeconfig, "--namespace", demoNamespace, "--lock", lockName,
		"--ledger", ledgerURL, "--name", name, "--per-charge", opts.perCharge().String())
	cmd := exec.Command(opts.WorkerCommand[0], args...)
	cmd.Env = append(append(os.Environ(), opts.WorkerEnv...), "POD_NAME="+name)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("starting worker %s: %w", name, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting worker %s: %w", name, err)
	}
	p := &workerProc{name: name, cmd: cmd, done: make(chan struct{}), state: "starting"}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.record(sc.Text())
		}
	}()
	return p, nil
}

// record parses "state <name> <token> [detail]" and "note lost <token>".
func (p *workerProc) record(line string) {
	fields := strings.Fields(line)
	if len(fields) == 3 && fields[0] == "note" && fields[1] == noteLost {
		p.mu.Lock()
		p.lost = true
		p.mu.Unlock()
		return
	}
	if len(fields) < 3 || fields[0] != "state" {
		return
	}
	token, _ := strconv.ParseInt(fields[2], 10, 64)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.state = fields[1]
	if token > 0 {
		p.token = token
	}
}

// snapshot returns the state, token and whether the process is frozen.
func (p *workerProc) snapshot() (string, int64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state, p.token, p.frozen
}

// lostGrant reports whether the worker has said it lost a grant.
func (p *workerProc) lostGrant() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lost
}

// freeze stops the process for real (SIGSTOP), as a GC pause or CPU
// throttling would.
func (p *workerProc) freeze() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("freezing %s: %w", p.name, err)
	}
	p.frozen = true
	return nil
}

// thaw resumes a frozen process (SIGCONT).
func (p *workerProc) thaw() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return fmt.Errorf("thawing %s: %w", p.name, err)
	}
	p.frozen = false
	return nil
}

// stop asks the worker to release and exit, and kills it after a grace.
func (p *workerProc) stop(grace time.Duration) {
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
	}
	_ = p.cmd.Wait()
}
