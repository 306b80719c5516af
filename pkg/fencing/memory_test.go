package fencing_test

import (
	"context"
	"sync"
	"testing"

	"github.com/frontdesk-dev/frontdesk/pkg/fencing"
	"github.com/frontdesk-dev/frontdesk/pkg/fencing/fencingtest"
)

func TestMemoryGuard(t *testing.T) {
	fencingtest.Run(t, func(t *testing.T) fencingtest.Backend {
		var mu sync.Mutex
		n := 0
		return fencingtest.Backend{
			Guard: fencing.NewMemoryGuard(),
			Inc:   func(context.Context) error { mu.Lock(); n++; mu.Unlock(); return nil },
			Read:  func() int { mu.Lock(); defer mu.Unlock(); return n },
		}
	})
}
