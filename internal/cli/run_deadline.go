package cli

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// deadlinePoll bounds each wait of the watchdog for its deadline, so that
// it notices a deadline that a jump of the deadline clock (a suspend,
// which the Go runtime's timers do not count) put in the past within
// deadlinePoll of the jump.
const deadlinePoll = 100 * time.Millisecond

// awaitDeadline waits until deadline passes on the clock now, and reports
// true; or until deadlines is closed, and reports false. Each value
// received on deadlines replaces deadline, unless deadline passed before
// it was received. after is time.After, or a fake in tests.
func awaitDeadline(deadline time.Duration, deadlines <-chan time.Duration,
	now func() time.Duration, after func(time.Duration) <-chan time.Time) bool {
	for {
		left := deadline - now()
		if left <= 0 {
			return true
		}
		select {
		case d, ok := <-deadlines:
			if !ok {
				return false
			}
			if now() >= deadline {
				return true
			}
			deadline = d
		case <-after(min(left, deadlinePoll)):
		}
	}
}

// writeDeadline writes deadline to w as the watchdog reads it: one line,
// nanoseconds on the deadline clock, in a single write.
func writeDeadline(w io.Writer, deadline time.Duration) error {
	if _, err := io.WriteString(w, strconv.FormatInt(int64(deadline), 10)+"\n"); err != nil {
		return fmt.Errorf("sending the deadline to the watchdog: %w", err)
	}
	return nil
}

// readDeadlines sends each deadline written by writeDeadline to r on the
// channel it returns, which is closed at EOF, on a read error, or at a
// line that is not a deadline.
func readDeadlines(r io.Reader) <-chan time.Duration {
	deadlines := make(chan time.Duration)
	go func() {
		defer close(deadlines)
		lines := bufio.NewScanner(r)
		for lines.Scan() {
			ns, err := strconv.ParseInt(lines.Text(), 10, 64)
			if err != nil {
				return
			}
			deadlines <- time.Duration(ns)
		}
	}()
	return deadlines
}

// watchdogDeadline is when the watchdog must SIGKILL the command's group
// for a grant safe until validUntil with Timing t: validUntil itself, on
// the deadline clock, counted from the start of the write that made it
// (never later). That is half the safety margin after kubectl dlock run's
// own SIGKILL (see deadlines), so that a running kubectl dlock run acts
// first, and still the whole margin before the lease could lapse for
// anyone else.
func watchdogDeadline(clk *bootClock, validUntil time.Time, t lock.Timing) time.Duration {
	return clk.toDeadline(validUntil.Add(-t.SafeWindow())) + t.SafeWindow()
}
