package controllers

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// A pass that starts from a copy the cache has not yet brought up to date
// would only lose a write race (a conflict, counted as a reconcile error) or
// judge a record that a newer one already replaced. Two such moments are
// known, and the controller waits them out instead: the event that brings
// the newer object also brings the next pass.
//   - The cache still shows the lock as it was before this controller's own
//     last write of it (its status, its finalizer): the pass is skipped.
//   - The Lease copy the pass judged carries a lower token than one an
//     event of its Lease already showed (a grant landed during the pass):
//     status would name the old record's holder beside the newer token, and
//     the next pass would take the newer holder for a grant made without a
//     new token (InvalidGrant). The status write is skipped.

// ownWrites remembers, per lock, the resourceVersion the lock had before
// this controller last wrote it.
type ownWrites struct {
	mu     sync.Mutex
	before map[types.NamespacedName]string
}

func newOwnWrites() *ownWrites { return &ownWrites{before: map[types.NamespacedName]string{}} }

// wrote notes that the controller wrote the lock over resourceVersion rv.
func (w *ownWrites) wrote(key types.NamespacedName, rv string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.before[key] = rv
}

// behind reports whether the cached lock, at resourceVersion rv, is still
// the one the controller last wrote over.
func (w *ownWrites) behind(key types.NamespacedName, rv string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.before[key] == rv {
		return true
	}
	delete(w.before, key)
	return false
}

func (w *ownWrites) forget(key types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.before, key)
}
