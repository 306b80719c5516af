package integration

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"
	_ "modernc.org/sqlite"

	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/pkg/fencing"
)

// Two locks named billing, in two namespaces, fenced on one memory guard
// and one SQL guard by their grants' keys: each lock keeps its own highest
// token. The first namespace's lock is at token 3 when the second's first
// grant (token 1) writes, which a guard keyed by the bare name refuses.
func TestFencingKeysKeepLocksOfOneNameApart(t *testing.T) {
	nsA, nsB := newNamespace(t), newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", nsA).Obj())
	createReadyLock(t, testutil.MakeLock("billing", nsB).Obj())
	g := NewWithT(t)
	ctx := context.Background()

	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "fencing.db")+"?_pragma=busy_timeout(10000)")
	g.Expect(err).NotTo(HaveOccurred())
	defer db.Close()
	sqlGuard, err := fencing.NewSQLGuard(db, "")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(sqlGuard.EnsureSchema(ctx)).To(Succeed())
	memGuard := fencing.NewMemoryGuard()
	noop := func(context.Context) error { return nil }

	clientA := newLockClient(t, nsA, "billing", "worker-a")
	for range 2 { // tokens 1 and 2
		earlier, err := clientA.TryAcquire(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(earlier.Release(ctx)).To(Succeed())
	}
	a, err := clientA.TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = a.Release(ctx) }()
	b, err := newLockClient(t, nsB, "billing", "worker-b").TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = b.Release(ctx) }()
	g.Expect(a.Token()).To(BeEquivalentTo(3))
	g.Expect(b.Token()).To(BeEquivalentTo(1))
	g.Expect(a.FencingKey()).To(Equal(nsA + "/billing"))
	g.Expect(b.FencingKey()).To(Equal(nsB + "/billing"))

	for _, guard := range []fencing.Guard{memGuard, sqlGuard} {
		g.Expect(guard.Fence(ctx, a.FencingKey(), a.Token(), noop)).To(Succeed())
		g.Expect(guard.Fence(ctx, b.FencingKey(), b.Token(), noop)).To(Succeed(), "%T: the other namespace's lock", guard)
		g.Expect(guard.Fence(ctx, a.FencingKey(), 2, noop)).To(MatchError(fencing.ErrStaleToken), "%T", guard)
	}
	g.Expect(memGuard.Highest(a.FencingKey())).To(BeEquivalentTo(3))
	g.Expect(memGuard.Highest(b.FencingKey())).To(BeEquivalentTo(1))
	for key, want := range map[string]int64{a.FencingKey(): 3, b.FencingKey(): 1} {
		got, err := sqlGuard.Highest(ctx, key)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(got).To(Equal(want), key)
	}

	// What the keys prevent: by the bare name, b's first write is refused.
	bare := fencing.NewMemoryGuard()
	g.Expect(bare.Fence(ctx, "billing", a.Token(), noop)).To(Succeed())
	g.Expect(bare.Fence(ctx, "billing", b.Token(), noop)).To(MatchError(fencing.ErrStaleToken))
}
