package lock

import (
	"math"
	"math/rand/v2"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// watchRetryDelay is how long a waiter first backs off when it cannot open
// a watch, before reading the Lease again (see watchBackoff).
const watchRetryDelay = time.Second

// renewBackoff is the backoff of a grant's writes retried after failures in
// a row (a renewal, the release of a lapsed grant): from a tenth of the
// renew interval (at most 100ms), doubling, up to half the interval, so
// that retries stay well inside the safe window. Each delay is taken at
// least 1ms (renewRetryDelay).
func renewBackoff(interval time.Duration) wait.Backoff {
	return wait.Backoff{Duration: min(interval/10, 100*time.Millisecond), Factor: 2, Steps: math.MaxInt32, Cap: interval / 2}
}

// renewRetryDelay is the next delay of b, a renewBackoff: at least 1ms.
func renewRetryDelay(b *wait.Backoff) time.Duration {
	return max(b.Step(), time.Millisecond)
}

// watchBackoff is the backoff of a waiter whose watches of the Lease could
// not be opened, failure after failure: watchRetryDelay, doubling, up to
// maxRecheck. Each delay is taken less a random quarter (jitterDown).
func watchBackoff() wait.Backoff {
	return wait.Backoff{Duration: watchRetryDelay, Factor: 2, Steps: math.MaxInt32, Cap: maxRecheck}
}

// jitterDown is d less a random part of up to a quarter, so that waiters
// cut off together (an apiserver restarting) do not come back together and
// none waits longer than d.
func jitterDown(d time.Duration) time.Duration {
	return d - time.Duration(rand.Int64N(int64(d/4)+1))
}
