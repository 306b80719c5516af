package lock

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

var (
	// ErrHeld means another holder owns the lock and its lease has not lapsed as
	// observed by this client (or the controller). Matched by *HeldError.
	ErrHeld = errors.New("lock is held by another holder")
	// ErrNotHolder means a release (or renewal) came from an identity that
	// does not hold the lock. Nothing was changed.
	ErrNotHolder = errors.New("not the holder of the lock")
	// ErrLost means a grant ended without being released: taken over, broken,
	// deleted, or not renewed in time.
	ErrLost = errors.New("lock lease lost")
	// ErrReleased is the cause of a grant's Context after Release.
	ErrReleased = errors.New("lock released")
	// ErrLockNotFound means the DistributedLock does not exist.
	ErrLockNotFound = errors.New("distributedlock not found")
	// ErrLeaseUnavailable means the lock's Lease is missing or being deleted; the
	// controller recreates it.
	ErrLeaseUnavailable = errors.New("lease unavailable")
	// ErrAnsweredTooLate means the Lease was granted to this client, but the
	// answer came back after the grant's safe window, so it was not handed
	// out: others may already hold the lock. The unusable grant keeps the
	// lock while the caller waits on (until it lapses), and is released
	// when the caller gives up, so this matches ErrHeld too.
	ErrAnsweredTooLate = fmt.Errorf("%w: the grant's answer came back too late to use", ErrHeld)
	// ErrIdentityInUse means another process holds the lock, or waits for it,
	// under this client's identity. Matched by *IdentityInUseError.
	ErrIdentityInUse = errors.New("identity in use by another client of the lock")
)

// IdentityInUseError says that another live client of the lock uses this
// client's identity: it holds the lock under it, or waits in the queue
// under it ahead of this caller. Identities must be unique per process
// (DefaultIdentity is).
type IdentityInUseError struct {
	// Lock is namespace/name of the DistributedLock.
	Lock string
	// Identity is the identity in use.
	Identity string
	// Holds: the other client holds the lock (with Token); else it waits
	// at queue Position.
	Holds    bool
	Token    int64
	Position int
}

// Error implements error.
func (e *IdentityInUseError) Error() string {
	what := fmt.Sprintf("waits for it at position %d of its queue", e.Position)
	if e.Holds {
		what = fmt.Sprintf("holds it (fencing token %d)", e.Token)
	}
	return fmt.Sprintf("another client of lock %s %s under identity %q, this client's: give each process an identity of its own "+
		"(leave --identity unset for a unique one); if that client is gone, its grant lapses after the lease, or is released with "+
		"kubectl dlock release %s --identity %s, and its place leaves the queue when its turn passes", e.Lock, what, e.Identity,
		lockNameOnly(e.Lock), e.Identity)
}

// Is makes errors.Is(err, ErrIdentityInUse) true.
func (e *IdentityInUseError) Is(target error) bool { return target == ErrIdentityInUse }

// lockNameOnly is the name part of namespace/name.
func lockNameOnly(lock string) string {
	if i := strings.LastIndex(lock, "/"); i >= 0 {
		return lock[i+1:]
	}
	return lock
}

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
