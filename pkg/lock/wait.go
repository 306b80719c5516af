package lock

import (
	"math/rand/v2"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
)

// leaseCopy is a copy of the Lease to judge, and where it came from.
type leaseCopy struct {
	lease *coordinationv1.Lease
	// fromWatch: the copy arrived in an event of a watch of every change.
	fromWatch bool
	// verified: the copy is a fresh read or a watch event, not a copy
	// remembered from an earlier call.
	verified bool
}

// waitHint tells Acquire what to wait for after a failed attempt: a change
// of the Lease after resourceVersion, or the deadline.
type waitHint struct {
	resourceVersion string
	deadline        time.Time
	// judged is the copy the attempt decided on, to judge again when the
	// deadline passes with no change.
	judged leaseCopy
	// behindFront: the caller waits in the queue behind its first
	// lease.FrontLength waiters, so it needs to hear of the Lease only when
	// it moves up to the front (see leaseWatch), and reads it afresh at the
	// deadline, which is at most maxRecheck away (waitBehindFront).
	behindFront bool
	// unwatched: the caller neither watches nor judges until the
	// deadline, then reads the Lease afresh.
	unwatched bool
}

// maxRecheck bounds how long a waiter behind the front of the queue goes
// without reading the Lease: at most a lease duration, and at most this.
const maxRecheck = 30 * time.Second

// waitBehindFront makes h the hint of a caller behind the front of the
// queue. Its watch hears of nothing else, so it also reads the Lease at
// least once per lease duration (or maxRecheck, if shorter), at a random
// moment in the last quarter of that, so that waiters who registered
// together do not read together: what a scoped watch does not bring (the
// Lease deleted and created again, a front label not set) costs it at most
// that long.
func (h *waitHint) waitBehindFront(now time.Time, duration time.Duration) {
	h.behindFront = true
	recheck := min(duration, maxRecheck)
	recheck -= time.Duration(rand.Int64N(int64(recheck/4) + 1))
	if at := now.Add(recheck); at.Before(h.deadline) {
		h.deadline = at
	}
}
