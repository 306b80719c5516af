package fencing

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"strings"
	"testing"
)

// raceDriver is a database whose CREATE TABLE always fails as PostgreSQL
// fails all but one of several first EnsureSchema calls at once; the DSN
// says whether the table is there all the same ("there") or not.
type raceDriver struct{}

func (raceDriver) Open(dsn string) (driver.Conn, error) {
	return raceConn{tableThere: dsn == "there"}, nil
}

type raceConn struct{ tableThere bool }

var errCatalogRace = errors.New(`duplicate key value violates unique constraint "pg_type_typname_nsp_index"`)

func (raceConn) Prepare(string) (driver.Stmt, error) { return nil, errors.New("not supported") }
func (raceConn) Close() error                        { return nil }
func (raceConn) Begin() (driver.Tx, error)           { return nil, errors.New("not supported") }

func (raceConn) ExecContext(_ context.Context, query string, _ []driver.NamedValue) (driver.Result, error) {
	if strings.HasPrefix(query, "CREATE TABLE") {
		return nil, errCatalogRace
	}
	return nil, errors.New("unexpected statement: " + query)
}

func (c raceConn) QueryContext(_ context.Context, query string, _ []driver.NamedValue) (driver.Rows, error) {
	if !c.tableThere {
		return nil, errors.New(`relation "frontdesk_fencing" does not exist`)
	}
	return emptyRows{}, nil
}

type emptyRows struct{}

func (emptyRows) Columns() []string         { return []string{"lock_name", "token"} }
func (emptyRows) Close() error              { return nil }
func (emptyRows) Next([]driver.Value) error { return io.EOF }

func init() { sql.Register("fencing-race", raceDriver{}) }

// EnsureSchema whose CREATE fails succeeds if the table is there (another
// replica created it at the same moment), and fails with the CREATE's error
// if it is not.
func TestEnsureSchemaWhenAnotherCallCreatedTheTable(t *testing.T) {
	for _, tc := range []struct {
		dsn     string
		wantErr bool
	}{{"there", false}, {"missing", true}} {
		db, err := sql.Open("fencing-race", tc.dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		g, _ := NewSQLGuard(db, "")
		err = g.EnsureSchema(context.Background())
		if (err != nil) != tc.wantErr || (tc.wantErr && !errors.Is(err, errCatalogRace)) {
			t.Errorf("table %s: EnsureSchema = %v, want error %v (the CREATE's)", tc.dsn, err, tc.wantErr)
		}
	}
}
