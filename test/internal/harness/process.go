package harness

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
)

// Process is a child process of a test (a worker, a manager, a re-executed
// test binary) and the lines it printed on stdout. Tests read its lines to
// learn what it did; the chaos and integration suites start every worker
// this way.
type Process struct {
	// Name says which process it is in failure messages.
	Name string
	// Done is closed once the process has exited and its output is read.
	Done chan struct{}

	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []string
}

// StartProcess starts argv with the test's environment plus env, its
// stderr going to stderr, and collects its stdout line by line.
func StartProcess(name string, argv, env []string, stderr io.Writer) (*Process, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Process{Name: name, cmd: cmd, Done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
		}
		_ = cmd.Wait()
		close(p.Done)
	}()
	return p, nil
}

// Output is every line the process printed so far.
func (p *Process) Output() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lines...)
}

// LinesWith is the lines printed so far that start with prefix.
func (p *Process) LinesWith(prefix string) []string {
	var out []string
	for _, l := range p.Output() {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return out
}

// Signal sends sig to the process (SIGSTOP freezes it, SIGCONT thaws it).
func (p *Process) Signal(sig syscall.Signal) { _ = p.cmd.Process.Signal(sig) }

// Kill kills the process, frozen or not, and waits until it has exited.
func (p *Process) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Kill()
	<-p.Done
}
