package bench

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

// The rotation gives the locks turns of a block of handoffs each, in order,
// skips a lock once it has its handoffs, and ends once all have theirs.
// Each lock is a goroutine playing its holders: wait for the turn, release
// (a measured handoff), record it.
func TestRotationTakesTurnsInBlocks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	finished := make(chan struct{})
	// Lock 1 needs fewer handoffs than the others would: want is shared,
	// so give lock 1 a head start of 3 instead.
	r := newRotation(3, 5, 2, func() { close(finished); cancel() })
	r.measured[1] = 3
	var mu sync.Mutex
	var turns []int
	var wg sync.WaitGroup
	for i := range 3 {
		p := r.pacer(i, func() bool { return true })
		wg.Go(func() {
			for {
				measured, err := p.await(ctx)
				if err != nil {
					return
				}
				if !measured {
					t.Errorf("lock %d: a release in its turn was not measured", i)
					return
				}
				mu.Lock()
				turns = append(turns, i)
				mu.Unlock()
				if p.record() {
					t.Errorf("lock %d: record ended its own measurement; only the rotation's end may", i)
				}
			}
		})
		if err := r.waitParked(ctx, i); err != nil {
			t.Fatalf("lock %d never parked: %v", i, err)
		}
	}
	r.start()
	wg.Wait()
	select {
	case <-finished:
	default:
		t.Fatalf("the rotation did not finish; turns %v", turns)
	}
	// Blocks of 2 until each lock has 5 (lock 1 has 3 already): 0,0 1,1
	// 2,2 0,0 2,2 0 2.
	want := []int{0, 0, 1, 1, 2, 2, 0, 0, 2, 2, 0, 2}
	if !slices.Equal(turns, want) {
		t.Fatalf("turns %v, want %v", turns, want)
	}
	for i, n := range r.measured {
		if n != 5 {
			t.Errorf("lock %d measured %d handoffs, want 5", i, n)
		}
	}
}

// A lock's holder releases at once, unmeasured, until its crowd has
// settled; then it waits (parked) for its turn, and releases measured once
// the turn is its own.
func TestRotationPacerWaitsForItsTurn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := newRotation(2, 4, 4, func() {})
	settled := false
	p1 := r.pacer(1, func() bool { return settled })

	if measured, err := p1.await(ctx); err != nil || measured {
		t.Fatalf("before settling: measured %v, err %v; want an unmeasured release at once", measured, err)
	}
	settled = true
	released := make(chan bool, 1)
	awaitErr := make(chan error, 1)
	go func() {
		measured, err := p1.await(ctx)
		awaitErr <- err
		released <- measured
	}()
	if err := r.waitParked(ctx, 1); err != nil {
		t.Fatalf("lock 1 never parked: %v", err)
	}
	r.start() // lock 0's turn
	select {
	case <-released:
		t.Fatal("lock 1 released during lock 0's turn")
	case <-time.After(50 * time.Millisecond):
	}
	p0 := r.pacer(0, func() bool { return true })
	for range 4 {
		p0.record()
	}
	select {
	case <-released:
		t.Fatal("lock 1 released before lock 0's next holder passed the turn on")
	case <-time.After(50 * time.Millisecond):
	}
	// Lock 0's next holder, after its hold, passes the turn on and parks.
	go func() { _, _ = p0.await(ctx) }()
	select {
	case measured := <-released:
		if err := <-awaitErr; err != nil {
			t.Fatalf("await: %v", err)
		}
		if !measured {
			t.Error("lock 1's release in its own turn was not measured")
		}
	case <-ctx.Done():
		t.Fatal("lock 1 did not get its turn after lock 0's block")
	}
}

// A pacer that waits for its turn gives up with ctx; one whose turn it is
// does not release after its ctx ended either.
func TestRotationPacerEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	r := newRotation(2, 1, 1, func() {})
	p := r.pacer(1, func() bool { return true })
	done := make(chan error, 1)
	go func() {
		_, err := p.await(ctx)
		done <- err
	}()
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Error("await returned no error after its ctx ended")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("await did not return after its ctx ended")
	}
	r.start() // lock 0's turn
	if measured, err := r.pacer(0, func() bool { return true }).await(ctx); err == nil || measured {
		t.Errorf("in its own turn after ctx ended: measured %v, err %v; want an error", measured, err)
	}
}

// everyHandoff measures every handoff and ends after n.
func TestEveryHandoffEndsAfterN(t *testing.T) {
	e := &everyHandoff{n: 3}
	if measured, err := e.await(context.Background()); !measured || err != nil {
		t.Fatalf("await: measured %v, err %v", measured, err)
	}
	for i := range 3 {
		if got, want := e.record(), i == 2; got != want {
			t.Fatalf("record %d: finished %v, want %v", i+1, got, want)
		}
	}
}
