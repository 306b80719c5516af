package lock

import (
	"math/rand/v2"
	"time"
)

// registerBackoffBase is how long a waiter backs off after losing its
// first registration race; the backoff doubles with each race lost in a
// row, up to maxRegisterBackoff (see registerBackoff).
const registerBackoffBase = 10 * time.Millisecond

// maxRegisterBackoff bounds the backoff between registration attempts.
const maxRegisterBackoff = time.Second

// registerBackoff is how long a waiter waits before registering again after
// losing conflicts registration races in a row: registerBackoffBase doubled
// for each race lost after the first, at most maxRegisterBackoff and a tenth
// of the lease, less a random half of that. Every registration is a
// compare-and-swap on the Lease, as are the holder's renewals and its
// release: a crowd arriving at once that retried each lost race at once
// would leave the holder one contender among all of them, and a holder of a
// 15 s lease was seen to lose its lease to 200 waiters registering together.
// Backing off spreads the crowd's attempts over time, so the holder's
// writes land among them; the random half keeps waiters that lost together
// from trying together again. A waiter backing off does not watch the
// Lease either (leaseWatch.next): a crowd not yet queued would otherwise
// receive, each of them, every registration of the others.
func registerBackoff(conflicts int, leaseDuration time.Duration) time.Duration {
	limit := max(min(maxRegisterBackoff, leaseDuration/10), registerBackoffBase)
	d := min(registerBackoffBase<<min(max(conflicts-1, 0), 16), limit)
	return d - time.Duration(rand.Int64N(int64(d/2)+1))
}
