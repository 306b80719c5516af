// Package fencing_test runs pkg/fencing's SQLGuard on SQLite: the guard
// tests every backend passes (internal/fencingtest), and its example. It
// lives in the test module so that importers of pkg/fencing do not inherit
// the SQLite driver.
package fencing_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	_ "modernc.org/sqlite"

	"github.com/frontdesk-dev/frontdesk/internal/fencingtest"
	"github.com/frontdesk-dev/frontdesk/pkg/fencing"
)

func TestSQLGuardOnSQLite(t *testing.T) {
	fencingtest.Run(t, func(t *testing.T) fencingtest.Backend {
		db := openSQLite(t)
		g, err := fencing.NewSQLGuard(db, "")
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
			tx, ok := fencing.TxFrom(ctx)
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
		return fencingtest.Backend{Guard: g, Inc: inc, Read: read, Transactional: true}
	})
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

// pkg/fencing's ExampleSQLGuard, run: a newer holder's write commits, a
// paused old holder's is refused.
func Example_sqlGuard() {
	db, _ := sql.Open("sqlite", "file::memory:")
	defer db.Close()
	db.SetMaxOpenConns(1) // one in-memory database, not one per connection
	guard, _ := fencing.NewSQLGuard(db, "")
	ctx := context.Background()
	_ = guard.EnsureSchema(ctx)
	_, _ = db.Exec(`CREATE TABLE charges (customer TEXT)`)

	key := fencing.LockKey("payments", "billing") // a holder has it from its grant: g.FencingKey()
	charge := func(token int64) error {
		return guard.FenceTx(ctx, key, token, func(tx *sql.Tx) error {
			_, err := tx.Exec(`INSERT INTO charges VALUES ('c-1')`)
			return err
		})
	}
	fmt.Println(charge(34)) // the current holder
	fmt.Println(charge(33)) // a holder that paused past its lease
	// Output:
	// <nil>
	// stale fencing token 33 for lock "payments/billing": a holder with token 34 has already written
}
