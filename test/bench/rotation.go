package bench

import (
	"context"
	"sync"
)

// handoffPacer decides when a holder in the handoff measurement may
// release, and which handoffs count.
type handoffPacer interface {
	// await blocks until the holder may release, and reports whether the
	// handoff that release starts is measured (false: one made while
	// waiters were still joining the queue).
	await(ctx context.Context) (measured bool, err error)
	// record counts a measured handoff; true means the measurement of this
	// lock is over.
	record() (finished bool)
}

// everyHandoff measures every handoff, as soon as the holder is ready,
// until it has n: the pacing of the side-by-side run (one lock).
type everyHandoff struct {
	mu sync.Mutex
	n  int
}

// await lets the holder release at once; every handoff is measured.
func (e *everyHandoff) await(ctx context.Context) (bool, error) { return true, ctx.Err() }

// record counts a handoff; the n-th ends the measurement.
func (e *everyHandoff) record() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n--
	return e.n <= 0
}

// rotation takes the handoff measurements of several locks (one per number
// of waiters) in turns: the holders of a lock release only during its
// turn, which lasts a block of handoffs, so that every number of waiters
// is measured over the same stretch of the run rather than one after the
// other. A machine's speed drifts from one stretch of minutes to the next
// (docs/benchmarks.md, "Method"); a ratio between two numbers of waiters
// measured minutes apart would measure that drift as much as the waiters.
//
// Each lock first settles: its holders release freely (those handoffs are
// not measured) until every waiter has joined the queue, then its holder
// waits for its turn, holding the lock. The turns start once every lock
// has settled (start), and go round until every lock has its handoffs;
// then finished is called. A turn is passed on by the lock's next holder,
// when it would release after its hold (handoffHold), not at the last
// grant of the block: the writes that follow a grant (the old holder
// queueing again, the controller's status write) are then behind it, as
// they are before every other measured release.
type rotation struct {
	mu sync.Mutex
	// changed is closed, and replaced, whenever turn or parked changes.
	changed chan struct{}
	// turn is the index of the lock whose holders may release; -1 before
	// start and after the last handoff.
	turn int
	// block is how many handoffs a turn lasts, want how many each lock
	// needs.
	block, want int
	// inTurn counts the handoffs measured in the current turn, measured
	// those of each lock; blockDone: the current turn has its handoffs and
	// is passed on at its lock's next await.
	inTurn    int
	blockDone bool
	measured  []int
	// parked: a settled lock's holder waits for its turn.
	parked   []bool
	finished func()
}

// newRotation paces locks locks, each measured for want (at least 1)
// handoffs in blocks of block; finished is called once all have them.
func newRotation(locks, want, block int, finished func()) *rotation {
	return &rotation{
		changed:  make(chan struct{}),
		turn:     -1,
		block:    max(block, 1),
		want:     max(want, 1),
		measured: make([]int, locks),
		parked:   make([]bool, locks),
		finished: finished,
	}
}

// pacer is the pacing of lock i, which has settled once settled says so.
func (r *rotation) pacer(i int, settled func() bool) handoffPacer {
	return &rotationPacer{r: r, i: i, settled: settled}
}

// start gives the first turn to lock 0.
func (r *rotation) start() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.turn = 0
	r.notify()
}

// waitParked blocks until lock i's holder waits for its turn, or ctx ends.
func (r *rotation) waitParked(ctx context.Context, i int) error {
	for {
		r.mu.Lock()
		parked, changed := r.parked[i], r.changed
		r.mu.Unlock()
		if parked {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// notify wakes everyone waiting on a change; r.mu is held.
func (r *rotation) notify() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// passTurn gives the turn to the next lock that still needs handoffs, or
// ends the rotation; r.mu is held.
func (r *rotation) passTurn() {
	r.inTurn, r.blockDone = 0, false
	for k := 1; k <= len(r.measured); k++ {
		if next := (r.turn + k) % len(r.measured); r.measured[next] < r.want {
			r.turn = next
			r.notify()
			return
		}
	}
	r.turn = -1
	r.notify()
	r.finished()
}

// rotationPacer is one lock's view of the rotation.
type rotationPacer struct {
	r       *rotation
	i       int
	settled func() bool
}

// await lets the holder release at once, unmeasured, while its crowd has
// not settled; then only during its lock's turn, measured. It passes on a
// turn whose block is done, and waits (parked) for the next.
func (p *rotationPacer) await(ctx context.Context) (bool, error) {
	if !p.settled() {
		return false, ctx.Err()
	}
	r := p.r
	for {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		r.mu.Lock()
		if r.turn == p.i && r.blockDone {
			r.passTurn()
		}
		if r.turn == p.i {
			r.mu.Unlock()
			return true, nil
		}
		if !r.parked[p.i] {
			r.parked[p.i] = true
			r.notify()
		}
		changed := r.changed
		r.mu.Unlock()
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-changed:
		}
	}
}

// record counts a measured handoff of the lock whose turn it is, and marks
// the turn's block done after its last. It never ends a lock's measurement
// by itself: a lock that has its handoffs holds on (its waiters leaving
// would disturb the others) until the rotation ends.
func (p *rotationPacer) record() bool {
	r := p.r
	r.mu.Lock()
	defer r.mu.Unlock()
	r.measured[p.i]++
	r.inTurn++
	if r.inTurn >= r.block || r.measured[p.i] >= r.want {
		r.blockDone = true
	}
	return false
}
