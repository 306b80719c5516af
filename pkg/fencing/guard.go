// Package fencing is the resource side of frontdesk: guards that accept an
// operation only if its fencing token is at least the highest token seen for
// that lock, so a holder that paused past its lease cannot write after a
// newer holder has. A guard knows a lock by its fencing key, which the
// grant gives (Grant.FencingKey in pkg/lock, Term.FencingKey in
// pkg/leaderelection; see LockKey):
//
//	err := guard.Fence(ctx, g.FencingKey(), g.Token(), write)
package fencing

import (
	"context"
	"errors"
	"fmt"
)

// ErrStaleToken is matched (errors.Is) by every StaleTokenError.
var ErrStaleToken = errors.New("stale fencing token")

// StaleTokenError rejects an operation whose token is lower than the highest
// one the guard has accepted for the lock.
type StaleTokenError struct {
	// Lock is the fencing key the token was checked against (LockKey).
	Lock string
	// Token is the rejected token.
	Token int64
	// Current is the highest token accepted so far.
	Current int64
}

// Error implements error.
func (e *StaleTokenError) Error() string {
	return fmt.Sprintf("stale fencing token %d for lock %q: a holder with token %d has already written", e.Token, e.Lock, e.Current)
}

// Is makes errors.Is(err, ErrStaleToken) true.
func (e *StaleTokenError) Is(target error) bool { return target == ErrStaleToken }

// Guard admits operations by fencing token, keeping the highest token
// accepted per fencing key.
type Guard interface {
	// Fence runs fn only if token is at least the highest token accepted
	// for the key lock, and then records token as the highest. The check,
	// fn and the record are atomic with respect to other Fence calls for the
	// same key: a stale holder can never slip a write in after a newer one.
	// When fn fails, the token is not recorded. A stale token returns a
	// *StaleTokenError without calling fn. Pass the grant's FencingKey as
	// lock (LockKey), never a lock's bare name: locks of one name in two
	// namespaces would share their highest token.
	Fence(ctx context.Context, lock string, token int64, fn func(ctx context.Context) error) error
}
