package lock

import (
	"errors"
	"fmt"
	"time"
)

var (
	// ErrHeld: another holder owns the lock and its lease has not lapsed as
	// observed by this client (or the controller). Matched by *HeldError.
	ErrHeld = errors.New("lock is held by another holder")
	// ErrNotHolder: a release (or renewal) by an identity that does not hold
	// the lock. Nothing was changed.
	ErrNotHolder = errors.New("not the holder of the lock")
	// ErrLost: a grant ended without being released: taken over, broken,
	// deleted, or not renewed in time.
	ErrLost = errors.New("lock lease lost")
	// ErrReleased is the cause of a grant's Context after Release.
	ErrReleased = errors.New("lock released")
	// ErrLockNotFound: the DistributedLock does not exist.
	ErrLockNotFound = errors.New("distributedlock not found")
	// ErrLeaseUnavailable: the lock's Lease is missing or being deleted; the
	// controller recreates it.
	ErrLeaseUnavailable = errors.New("lease unavailable")
	// ErrAnsweredTooLate: the Lease was granted to this client, but the
	// answer came back after the grant's safe window, so it was not handed
	// out: others may already hold the lock. The unusable grant keeps the
	// lock until it lapses, so this matches ErrHeld too.
	ErrAnsweredTooLate = fmt.Errorf("%w: the grant's answer came back too late to use", ErrHeld)
)

// HeldError says who holds the lock and until when, as observed here, or,
// for a free lock, that waiters queued ahead have their turn first.
type HeldError struct {
	// Lock is namespace/name of the DistributedLock.
	Lock string
	// Holder is the current holder's identity ("" when the lock is free
	// but waiters are queued ahead).
	Holder string
	// Ahead is how many queued waiters come before this caller.
	Ahead int
	// Token is the holder's fencing token.
	Token int64
	// FreeAt is when the lock becomes free if the holder stays silent: this
	// client's first sighting of the current Lease record plus the lease
	// duration (local clock; never the holder's timestamps).
	FreeAt time.Time
}

// Error implements error.
func (e *HeldError) Error() string {
	if e.Holder == "" {
		return fmt.Sprintf("lock %s is free, but %d queued waiter(s) come first (their turn ends ~%s)",
			e.Lock, e.Ahead, e.FreeAt.Format(time.RFC3339))
	}
	msg := fmt.Sprintf("lock %s is held by %s (fencing token %d) until ~%s unless it renews",
		e.Lock, e.Holder, e.Token, e.FreeAt.Format(time.RFC3339))
	if e.Ahead > 0 {
		msg += fmt.Sprintf("; %d queued waiter(s) come first", e.Ahead)
	}
	return msg
}

// Is makes errors.Is(err, ErrHeld) true.
func (e *HeldError) Is(target error) bool { return target == ErrHeld }
