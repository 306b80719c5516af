package cli

import (
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// commandWatch ends a running command's process group as its grant's
// timing says, and keeps the watchdog's deadline on the grant's.
type commandWatch struct {
	c      *lock.Client
	clk    *bootClock
	g      *lock.Grant
	t      lock.Timing
	grace  time.Duration
	grp    *processGroup
	name   string // the command's, for messages
	stderr io.Writer

	// sent is the ValidUntil the watchdog's deadline was last computed
	// from.
	sent time.Time
	// ranOut is set once the group got SIGTERM or SIGKILL because
	// renewals were failing (or the watchdog's deadline passed).
	ranOut, termSent bool
	// timer fires at the next deadline: SIGTERM, then SIGKILL. Renewals
	// move the deadlines, so it is re-armed from ValidUntil when it fires.
	timer *time.Timer
}

// wait forwards signals to the group until the command exited, and returns
// what its Wait returned. On the way it SIGTERMs and SIGKILLs the group as
// the grant's deadlines pass, SIGKILLs it when the grant is lost or the
// watchdog dies, and extends the watchdog's deadline after each renewal.
func (w *commandWatch) wait(exited <-chan error, signals <-chan os.Signal) error {
	w.timer = time.NewTimer(time.Hour)
	defer w.timer.Stop()
	w.arm()
	// The watchdog's deadline follows each renewal that got through.
	extendTick := time.NewTicker(w.t.RenewInterval / 4)
	defer extendTick.Stop()
	for {
		select {
		case sig := <-signals:
			w.grp.signal(sig.(syscall.Signal))
		case err := <-exited:
			return err
		case <-extendTick.C:
			w.extend()
		case <-w.grp.expired:
			// The watchdog SIGKILLed the group, and said so.
			w.ranOut = true
			return <-exited
		case <-w.grp.gone:
			w.watchdogGone()
			return <-exited
		case <-w.g.Lost():
			w.grp.kill()
			fmt.Fprintf(w.stderr, "kubectl-dlock: lease on %s lost (%s); SIGKILL to %s's process group\n",
				printable(w.c.LockName()), printable(w.g.Err().Error()), printable(w.name))
			return <-exited
		case <-w.timer.C:
			if w.onDeadline() {
				return <-exited
			}
		}
	}
}

// arm sets the timer to the next deadline.
func (w *commandWatch) arm() {
	term, kill := deadlines(w.g.ValidUntil(), w.t, w.grace)
	next := kill
	if !w.termSent && w.grace > 0 {
		next = term
	}
	w.timer.Reset(time.Until(next))
}

// extend sends the watchdog the deadline of the latest renewal, if there
// was one since the last.
func (w *commandWatch) extend() {
	if vu := w.g.ValidUntil(); !vu.Equal(w.sent) {
		// A failed write means the watchdog died: grp.gone says so.
		_ = w.grp.extend(watchdogDeadline(w.clk, vu, w.t))
		w.sent = vu
	}
}

// watchdogGone SIGKILLs the group if the watchdog died without doing so.
func (w *commandWatch) watchdogGone() {
	select {
	case <-w.grp.expired:
	default:
		w.grp.kill()
		fmt.Fprintf(w.stderr, "kubectl-dlock: the watchdog of %s's process group died: SIGKILL to the group\n", w.name)
	}
	w.ranOut = true
}

// onDeadline sends the signal whose deadline passed, re-arms the timer,
// and reports whether the group got SIGKILL.
func (w *commandWatch) onDeadline() (killed bool) {
	term, kill := deadlines(w.g.ValidUntil(), w.t, w.grace)
	now := time.Now()
	sinceRenewal := now.Sub(w.g.ValidUntil().Add(-w.t.SafeWindow())).Round(time.Millisecond)
	switch {
	case !now.Before(kill):
		w.grp.kill()
		w.ranOut = true
		fmt.Fprintf(w.stderr, "kubectl-dlock: no renewal of the lease on %s got through for %s: SIGKILL to %s's process group, before the lease could lapse\n",
			w.c.LockName(), sinceRenewal, w.name)
		return true
	case !w.termSent && w.grace > 0 && !now.Before(term):
		w.grp.signal(syscall.SIGTERM)
		w.ranOut, w.termSent = true, true
		fmt.Fprintf(w.stderr, "kubectl-dlock: no renewal of the lease on %s got through for %s: SIGTERM to %s's process group; SIGKILL in %s (--grace %s) unless one does\n",
			w.c.LockName(), sinceRenewal, w.name, kill.Sub(now).Round(time.Millisecond), w.grace.Truncate(time.Millisecond))
	}
	w.arm()
	return false
}
