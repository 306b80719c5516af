package localrun

import (
	"fmt"
	"io"
	"os/exec"
	"runtime"
	"syscall"
	"time"
)

// managerProcess is the frontdesk manager running as a child process.
type managerProcess struct {
	cmd *exec.Cmd
	// done is closed when the process has exited; err is then how.
	done chan struct{}
	err  error
}

// startManager starts argv as the manager: in a process group of its own
// (a Ctrl-C in the terminal reaches frontdesk-local, which stops the manager
// before the control plane) and, where the OS allows, with a signal to end
// it should frontdesk-local die without stopping it.
func startManager(argv []string, output io.Writer) (*managerProcess, error) {
	m := &managerProcess{done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// The parent-death signal fires when the *thread* that started the
		// child ends: keep this goroutine on its thread while the child runs.
		runtime.LockOSThread()
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Stdout, cmd.Stderr = output, output
		cmd.SysProcAttr = managerProcAttr()
		if err := cmd.Start(); err != nil {
			runtime.UnlockOSThread()
			started <- err
			return
		}
		m.cmd = cmd
		started <- nil
		m.err = cmd.Wait()
		close(m.done)
		// Returning while locked ends the thread, which is what we want
		// now that the child is gone.
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("starting the manager %s: %w", argv[0], err)
	}
	return m, nil
}

func (m *managerProcess) pid() int { return m.cmd.Process.Pid }

// stop sends SIGTERM to the manager's process group, then SIGKILL after
// grace, and waits until it has exited.
func (m *managerProcess) stop(grace time.Duration) {
	select {
	case <-m.done:
		return // its pid may belong to someone else by now
	default:
	}
	_ = syscall.Kill(-m.pid(), syscall.SIGTERM)
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-m.done:
	case <-timer.C:
		_ = syscall.Kill(-m.pid(), syscall.SIGKILL)
		<-m.done
	}
}
