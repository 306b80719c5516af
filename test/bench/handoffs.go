package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
)

// handoffCrowd is one crowd handoffsInTurns measures: n waiters on lock
// name in namespace ns, through sys; what names it in an error.
type handoffCrowd struct {
	what     string
	ns, name string
	n        int
	sys      lockSystem
}

// handoffsInTurns measures want handoffs of each crowd (see handoff), the
// crowds in turns of block handoffs (see rotation), each measured once its
// waiters have all joined the queue (as a watch of the Lease, through cs,
// sees it); the next crowd starts once the one before has joined and waits
// for its turn. Its results are the crowds', in order.
func handoffsInTurns(ctx context.Context, cs kubernetes.Interface, crowds []handoffCrowd, want, block int) ([]handoffRows, error) {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	rot := newRotation(len(crowds), want, block, cancel)
	results := make([]handoffRows, len(crowds))
	errs := make(chan error, len(crowds))
	var wg sync.WaitGroup
	for i, c := range crowds {
		joined := followQueue(runCtx, cs, c.ns, c.name, c.n)
		pace := rot.pacer(i, func() bool { return joined.count() >= c.n })
		wg.Go(func() {
			h, err := handoff(runCtx, c.sys, c.name, c.n, pace)
			if err != nil {
				errs <- fmt.Errorf("%s: %w", c.what, err)
				cancel()
			}
			results[i] = h
		})
		if rot.waitParked(runCtx, i) != nil {
			break
		}
	}
	// The last crowd's final unmeasured handoff is followed by its writes
	// (the old holder queueing again, the status write): let them pass, as
	// a hold lets them pass before every measured release.
	select {
	case <-runCtx.Done():
	case <-time.After(handoffHold):
		rot.start()
	}
	wg.Wait()
	select {
	case err := <-errs:
		return nil, err
	default:
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("measuring handoffs: %w", err)
	}
	return results, nil
}
