package fencing

import (
	"context"
	"sync"
)

// MemoryGuard is an in-process Guard: for services that keep the protected
// state in memory, or that front it with a single process.
type MemoryGuard struct {
	mu    sync.Mutex
	locks map[string]*memoryLock
}

type memoryLock struct {
	mu      sync.Mutex
	highest int64
}

// NewMemoryGuard returns an empty MemoryGuard.
func NewMemoryGuard() *MemoryGuard {
	return &MemoryGuard{locks: map[string]*memoryLock{}}
}

// Fence implements Guard. Calls for the same fencing key are serialized;
// calls for different keys run in parallel.
func (g *MemoryGuard) Fence(ctx context.Context, lock string, token int64, fn func(ctx context.Context) error) error {
	l := g.entry(lock)
	l.mu.Lock()
	defer l.mu.Unlock()
	if token < l.highest {
		return &StaleTokenError{Lock: lock, Token: token, Current: l.highest}
	}
	if err := fn(ctx); err != nil {
		return err
	}
	l.highest = token
	return nil
}

// Highest is the highest token accepted for the fencing key lock (0 if
// none).
func (g *MemoryGuard) Highest(lock string) int64 {
	l := g.entry(lock)
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.highest
}

func (g *MemoryGuard) entry(lock string) *memoryLock {
	g.mu.Lock()
	defer g.mu.Unlock()
	l, ok := g.locks[lock]
	if !ok {
		l = &memoryLock{}
		g.locks[lock] = l
	}
	return l
}
