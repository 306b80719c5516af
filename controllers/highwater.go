package controllers

import (
	"sync"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// tokenHighWater remembers, per lock, the highest token seen in
// any Lease event, old or new object, as the informer delivers them. The
// reconciler reads only the newest Lease from its cache, and the status may
// lag it: a Lease wound back by hand right after a grant the controller had
// not reconciled yet would otherwise set the floor below a token already
// handed out. After a restart it starts empty; status.fencingToken then
// carries what was recorded.
type tokenHighWater struct {
	mu   sync.Mutex
	seen map[types.NamespacedName]int64
}

func newTokenHighWater() *tokenHighWater {
	return &tokenHighWater{seen: map[types.NamespacedName]int64{}}
}

// observe records the Lease's token for the lock.
func (h *tokenHighWater) observe(lock types.NamespacedName, l *coordinationv1.Lease) {
	token := lease.Token(l)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seen[lock] = max(h.seen[lock], token)
}

// get is the highest token seen for the lock (0 if none).
func (h *tokenHighWater) get(lock types.NamespacedName) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.seen[lock]
}

func (h *tokenHighWater) forget(lock types.NamespacedName) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.seen, lock)
}
