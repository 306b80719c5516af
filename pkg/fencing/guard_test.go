package fencing

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	_ "modernc.org/sqlite"
)

// guards returns each Guard implementation with a way to read back the
// protected state: a counter incremented by every admitted operation.
func guards() map[string]func(t *testing.T) (Guard, func(ctx context.Context) error, func() int) {
	return map[string]func(t *testing.T) (Guard, func(ctx context.Context) error, func() int){
		"memory": func(t *testing.T) (Guard, func(ctx context.Context) error, func() int) {
			g := NewMemoryGuard()
			var mu sync.Mutex
			n := 0
			inc := func(context.Context) error { mu.Lock(); n++; mu.Unlock(); return nil }
			return g, inc, func() int { mu.Lock(); defer mu.Unlock(); return n }
		},
		"sqlite": func(t *testing.T) (Guard, func(ctx context.Context) error, func() int) {
			db := openSQLite(t)
			g, err := NewSQLGuard(db, "")
			if err != nil {
				t.Fatal(err)
			}
			if err := g.EnsureSchema(context.Background()); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Exec(`CREATE TABLE counter (n INTEGER NOT NULL); INSERT INTO counter VALUES (0)`); err != nil {
				t.Fatal(err)
			}
			inc := func(ctx context.Context) error {
				tx, ok := TxFrom(ctx)
				if !ok {
					return errors.New("no transaction in context")
				}
				_, err := tx.ExecContext(ctx, `UPDATE counter SET n = n + 1`)
				return err
			}
			read := func() int {
				var n int
				if err := db.QueryRow(`SELECT n FROM counter`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			return g, inc, read
		},
	}
}

func openSQLite(t *testing.T) *sql.DB {
	t.Helper()
	dsn := "file:" + filepath.Join(t.TempDir(), "ledger.db") + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func TestGuardAdmitsByToken(t *testing.T) {
	steps := []struct {
		lock    string
		token   int64
		wantErr bool
		current int64
	}{
		{"billing", 3, false, 0},
		{"billing", 3, false, 0}, // the same holder writes again
		{"billing", 5, false, 0}, // a newer holder
		{"billing", 4, true, 5},  // the paused old holder wakes up
		{"billing", 3, true, 5},
		{"payments", 1, false, 0}, // locks are independent
		{"billing", 6, false, 0},
	}
	for name, mk := range guards() {
		t.Run(name, func(t *testing.T) {
			g, inc, read := mk(t)
			admitted := 0
			for i, s := range steps {
				err := g.Fence(context.Background(), s.lock, s.token, inc)
				if !s.wantErr {
					if err != nil {
						t.Fatalf("step %d: token %d on %s rejected: %v", i, s.token, s.lock, err)
					}
					admitted++
					continue
				}
				var stale *StaleTokenError
				if !errors.As(err, &stale) || !errors.Is(err, ErrStaleToken) {
					t.Fatalf("step %d: token %d on %s: got %v, want a StaleTokenError", i, s.token, s.lock, err)
				}
				if stale.Current != s.current || stale.Token != s.token || stale.Lock != s.lock {
					t.Errorf("step %d: error %+v, want current %d", i, stale, s.current)
				}
			}
			if got := read(); got != admitted {
				t.Errorf("protected counter = %d, want %d admitted operations", got, admitted)
			}
		})
	}
}

func TestGuardDoesNotRecordTokenWhenOperationFails(t *testing.T) {
	for name, mk := range guards() {
		t.Run(name, func(t *testing.T) {
			g, inc, _ := mk(t)
			ctx := context.Background()
			if err := g.Fence(ctx, "l", 2, inc); err != nil {
				t.Fatal(err)
			}
			boom := errors.New("write failed")
			if err := g.Fence(ctx, "l", 9, func(context.Context) error { return boom }); !errors.Is(err, boom) {
				t.Fatalf("got %v, want the operation's error", err)
			}
			if err := g.Fence(ctx, "l", 3, inc); err != nil {
				t.Errorf("token 3 after a failed write with 9: %v; the failed write must not raise the floor", err)
			}
		})
	}
}

// Many writers with interleaved tokens race on one lock: the sequence of
// admitted tokens, in the order the operations ran, never goes down.
func TestGuardConcurrentWritersNeverAdmitLowerAfterHigher(t *testing.T) {
	for name, mk := range guards() {
		t.Run(name, func(t *testing.T) {
			g, _, _ := mk(t)
			var mu sync.Mutex
			var order []int64
			var wg sync.WaitGroup
			for w := range 8 {
				wg.Go(func() {
					for i := range 25 {
						token := int64(i*8 + w%3)
						_ = g.Fence(context.Background(), "l", token, func(context.Context) error {
							mu.Lock()
							order = append(order, token)
							mu.Unlock()
							return nil
						})
					}
				})
			}
			wg.Wait()
			if len(order) == 0 {
				t.Fatal("nothing was admitted")
			}
			for i := 1; i < len(order); i++ {
				if order[i] < order[i-1] {
					t.Fatalf("admitted token %d after %d (position %d)", order[i], order[i-1], i)
				}
			}
		})
	}
}

func TestNewSQLGuardRejectsBadTableName(t *testing.T) {
	if _, err := NewSQLGuard(nil, "x; DROP TABLE y"); err == nil {
		t.Fatal("accepted a table name with SQL in it")
	}
}

func ExampleSQLGuard() {
	db, _ := sql.Open("sqlite", "file::memory:")
	defer db.Close()
	db.SetMaxOpenConns(1) // one in-memory database, not one per connection
	guard, _ := NewSQLGuard(db, "")
	ctx := context.Background()
	_ = guard.EnsureSchema(ctx)
	_, _ = db.Exec(`CREATE TABLE charges (customer TEXT)`)

	charge := func(token int64) error {
		return guard.FenceTx(ctx, "billing", token, func(tx *sql.Tx) error {
			_, err := tx.Exec(`INSERT INTO charges VALUES ('c-1')`)
			return err
		})
	}
	fmt.Println(charge(34)) // the current holder
	fmt.Println(charge(33)) // a holder that paused past its lease
	// Output:
	// <nil>
	// stale fencing token 33 for lock "billing": a holder with token 34 has already written
}

// A panic inside the fenced operation rolls everything back and goes on to
// the caller: the token is not recorded, a SQL transaction is not leaked
// (a leaked one holds SQLite's write lock, so the next fenced write fails
// with "database is locked"), and the operation's writes are undone.
func TestGuardRollsBackWhenOperationPanics(t *testing.T) {
	for name, mk := range guards() {
		t.Run(name, func(t *testing.T) {
			g, inc, read := mk(t)
			ctx := context.Background()
			if err := g.Fence(ctx, "l", 2, inc); err != nil {
				t.Fatal(err)
			}
			recovered := func() (v any) {
				defer func() { v = recover() }()
				_ = g.Fence(ctx, "l", 9, func(ctx context.Context) error {
					if err := inc(ctx); err != nil {
						t.Errorf("write before the panic: %v", err)
					}
					panic("boom")
				})
				return nil
			}()
			if recovered != "boom" {
				t.Fatalf("recovered %v, want the operation's own panic passed on", recovered)
			}

			next, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if err := g.Fence(next, "l", 3, inc); err != nil {
				t.Fatalf("the next fenced write after a panic: %v; the panicked operation must be rolled back (token 9 not recorded, no transaction left open)", err)
			}
			if name == "sqlite" {
				if got := read(); got != 2 {
					t.Errorf("counter = %d, want 2: the write made before the panic must be rolled back", got)
				}
			}
		})
	}
}
