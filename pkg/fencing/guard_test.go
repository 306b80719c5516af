package fencing

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
)

func TestNewSQLGuardRejectsBadTableName(t *testing.T) {
	if _, err := NewSQLGuard(nil, "x; DROP TABLE y"); err == nil {
		t.Fatal("accepted a table name with SQL in it")
	}
}

// The *sql.DB comes from a driver for PostgreSQL or SQLite, which the
// importer chooses: this package registers none (here modernc.org/sqlite,
// which registers "sqlite"). The test module runs the guard on SQLite
// (test/fencing).
func ExampleSQLGuard() {
	db, _ := sql.Open("sqlite", "file::memory:")
	defer db.Close()
	db.SetMaxOpenConns(1) // one in-memory database, not one per connection
	guard, _ := NewSQLGuard(db, "")
	ctx := context.Background()
	_ = guard.EnsureSchema(ctx)
	_, _ = db.Exec(`CREATE TABLE charges (customer TEXT)`)

	key := LockKey("payments", "billing") // a holder has it from its grant: g.FencingKey()
	charge := func(token int64) error {
		return guard.FenceTx(ctx, key, token, func(tx *sql.Tx) error {
			_, err := tx.Exec(`INSERT INTO charges VALUES ('c-1')`)
			return err
		})
	}
	fmt.Println(charge(34)) // the current holder: <nil>
	fmt.Println(charge(33)) // a holder that paused past its lease:
	// stale fencing token 33 for lock "payments/billing": a holder with token 34 has already written
}

// Locks of one name in two namespaces have two keys, and a guard keeps a
// highest token for each.
func ExampleLockKey() {
	guard := NewMemoryGuard()
	write := func(context.Context) error { return nil }
	fmt.Println(guard.Fence(context.Background(), LockKey("default", "billing"), 5, write))
	fmt.Println(guard.Fence(context.Background(), LockKey("team-a", "billing"), 1, write))
	fmt.Println(guard.Fence(context.Background(), LockKey("default", "billing"), 4, write))
	// Output:
	// <nil>
	// <nil>
	// stale fencing token 4 for lock "default/billing": a holder with token 5 has already written
}
