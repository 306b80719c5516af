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

	charge := func(token int64) error {
		return guard.FenceTx(ctx, "billing", token, func(tx *sql.Tx) error {
			_, err := tx.Exec(`INSERT INTO charges VALUES ('c-1')`)
			return err
		})
	}
	fmt.Println(charge(34)) // the current holder: <nil>
	fmt.Println(charge(33)) // a holder that paused past its lease:
	// stale fencing token 33 for lock "billing": a holder with token 34 has already written
}
