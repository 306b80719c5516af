package fencing

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
)

// DefaultTable is the table SQLGuard keeps the highest token per lock in.
const DefaultTable = "frontdesk_fencing"

var tableName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// SQLGuard is a Guard backed by a database/sql database: the token check is a
// conditional upsert in the same transaction as the protected write, so the
// database itself refuses a stale holder. The SQL (INSERT ... ON CONFLICT ...
// DO UPDATE ... WHERE, $n placeholders) runs on PostgreSQL 9.5+ and SQLite
// 3.24+.
type SQLGuard struct {
	db    *sql.DB
	table string
}

// NewSQLGuard returns a guard that keeps tokens in table (DefaultTable when
// empty). The table must exist before the first Fence: call EnsureSchema,
// or create it with your migrations.
func NewSQLGuard(db *sql.DB, table string) (*SQLGuard, error) {
	if table == "" {
		table = DefaultTable
	}
	if !tableName.MatchString(table) {
		return nil, fmt.Errorf("fencing table name %q: use letters, digits and underscores", table)
	}
	return &SQLGuard{db: db, table: table}, nil
}

// EnsureSchema creates the token table if it does not exist, and leaves an
// existing one as it is: lock_name TEXT PRIMARY KEY (the fencing key) and
// token BIGINT NOT NULL (the highest token accepted for it), one row per
// key. Call it when the service starts, before the first Fence; calling it
// again, or from several replicas at once, changes nothing.
func (g *SQLGuard) EnsureSchema(ctx context.Context) error {
	_, err := g.db.ExecContext(ctx, fmt.Sprintf(
		`CREATE TABLE IF NOT EXISTS %s (lock_name TEXT PRIMARY KEY, token BIGINT NOT NULL)`, g.table))
	if err == nil {
		return nil
	}
	// PostgreSQL can fail a CREATE TABLE IF NOT EXISTS run at the same
	// moment as another (a unique violation in its catalog): the table is
	// there if another call made it meanwhile.
	if g.tableExists(ctx) {
		return nil
	}
	return fmt.Errorf("creating fencing table %s: %w", g.table, err)
}

// tableExists reports whether the token table can be read, with its columns.
func (g *SQLGuard) tableExists(ctx context.Context) bool {
	rows, err := g.db.QueryContext(ctx, fmt.Sprintf(`SELECT lock_name, token FROM %s WHERE 1 = 0`, g.table))
	if err != nil {
		return false
	}
	return rows.Close() == nil
}

type txKey struct{}

// TxFrom returns the transaction a SQLGuard opened for the fn it runs, so the
// protected write joins the token check's transaction.
func TxFrom(ctx context.Context) (*sql.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(*sql.Tx)
	return tx, ok
}

// Fence implements Guard: fn's ctx carries the transaction (see TxFrom).
func (g *SQLGuard) Fence(ctx context.Context, lock string, token int64, fn func(ctx context.Context) error) error {
	return g.FenceTx(ctx, lock, token, func(tx *sql.Tx) error {
		return fn(context.WithValue(ctx, txKey{}, tx))
	})
}

// FenceTx runs fn inside one transaction that first raises the lock's
// recorded token to token, only if token is not lower than it. A stale token
// rolls back and returns a *StaleTokenError; an error from fn rolls back and
// is returned as is; a panic in fn rolls back and then continues (the
// transaction and its connection are never leaked). Only when fn returns nil
// is the transaction committed.
func (g *SQLGuard) FenceTx(ctx context.Context, lock string, token int64, fn func(tx *sql.Tx) error) error {
	tx, err := g.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("beginning fenced transaction for lock %q: %w", lock, err)
	}
	committed := false
	defer func() {
		// Runs on every way out, a panic in fn included (the panic goes on
		// once this returns): whatever did not commit is rolled back.
		if !committed {
			_ = tx.Rollback()
		}
	}()
	res, err := tx.ExecContext(ctx, fmt.Sprintf(
		`INSERT INTO %[1]s (lock_name, token) VALUES ($1, $2)
		 ON CONFLICT (lock_name) DO UPDATE SET token = excluded.token WHERE %[1]s.token <= excluded.token`, g.table),
		lock, token)
	if err != nil {
		return fmt.Errorf("checking fencing token %d for lock %q: %w", token, lock, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("checking fencing token %d for lock %q: %w", token, lock, err)
	}
	if n == 0 {
		current, err := g.current(ctx, tx, lock)
		if err != nil {
			return err
		}
		return &StaleTokenError{Lock: lock, Token: token, Current: current}
	}
	if err := fn(tx); err != nil {
		return err
	}
	committed = true // Commit ends the transaction whatever it returns
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("committing fenced transaction for lock %q: %w", lock, err)
	}
	return nil
}

// Highest is the highest token recorded for the fencing key lock (0 if
// none).
func (g *SQLGuard) Highest(ctx context.Context, lock string) (int64, error) {
	var token int64
	err := g.db.QueryRowContext(ctx, fmt.Sprintf(`SELECT token FROM %s WHERE lock_name = $1`, g.table), lock).Scan(&token)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading fencing token of lock %q: %w", lock, err)
	}
	return token, nil
}

func (g *SQLGuard) current(ctx context.Context, tx *sql.Tx, lock string) (int64, error) {
	var token int64
	if err := tx.QueryRowContext(ctx, fmt.Sprintf(`SELECT token FROM %s WHERE lock_name = $1`, g.table), lock).Scan(&token); err != nil {
		return 0, fmt.Errorf("reading fencing token of lock %q: %w", lock, err)
	}
	return token, nil
}
