package demo

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"time"

	_ "modernc.org/sqlite" // the embedded SQL database

	"github.com/frontdesk-dev/frontdesk/pkg/fencing"
)

// lockKey is the fencing key the ledger guards charges with.
const lockKey = "billing"

// Ledger is the billing service: it records charges in an embedded SQLite
// database, optionally behind a fencing SQLGuard, and counts what happened.
type Ledger struct {
	db      *sql.DB
	guard   *fencing.SQLGuard
	fenced  bool
	started time.Time
	srv     *http.Server
	// URL is where the ledger listens (loopback).
	URL string
}

// StartLedger opens a fresh database in dir with customers 1..customers and
// serves the ledger on listen ("127.0.0.1:0" for a free loopback port).
func StartLedger(dir string, customers int, fenced bool, listen string) (*Ledger, error) {
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "ledger.db")+"?_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=busy_timeout(10000)")
	if err != nil {
		return nil, fmt.Errorf("opening ledger database: %w", err)
	}
	db.SetMaxOpenConns(1) // one writer; SQLite serializes anyway
	l := &Ledger{db: db, fenced: fenced, started: time.Now()}
	if err := l.init(customers); err != nil {
		_ = db.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("listening: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /unbilled", l.unbilled)
	mux.HandleFunc("POST /charge", l.charge)
	mux.HandleFunc("POST /begin", l.begin)
	mux.HandleFunc("POST /complete", l.complete)
	mux.HandleFunc("GET /complete", l.isComplete)
	mux.HandleFunc("GET /stats", l.stats)
	l.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	l.URL = "http://" + ln.Addr().String()
	go func() { _ = l.srv.Serve(ln) }()
	return l, nil
}

func (l *Ledger) init(customers int) error {
	ctx := context.Background()
	for _, stmt := range []string{
		`CREATE TABLE customers (id INTEGER PRIMARY KEY)`,
		`CREATE TABLE charges (id INTEGER PRIMARY KEY AUTOINCREMENT, customer INTEGER NOT NULL, worker TEXT NOT NULL, token INTEGER NOT NULL, at_ms INTEGER NOT NULL)`,
		`CREATE TABLE rejected (customer INTEGER NOT NULL, worker TEXT NOT NULL, token INTEGER NOT NULL, current_token INTEGER NOT NULL, at_ms INTEGER NOT NULL)`,
		`CREATE TABLE job (id INTEGER PRIMARY KEY CHECK (id = 1), worker TEXT NOT NULL, token INTEGER NOT NULL)`,
		`CREATE TABLE runs (worker TEXT NOT NULL, token INTEGER NOT NULL, at_ms INTEGER NOT NULL)`,
	} {
		if _, err := l.db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("creating ledger schema: %w", err)
		}
	}
	if _, err := l.db.ExecContext(ctx,
		`WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $1) INSERT INTO customers SELECT i FROM n`, customers); err != nil {
		return fmt.Errorf("creating customers: %w", err)
	}
	if !l.fenced {
		return nil
	}
	g, err := fencing.NewSQLGuard(l.db, "")
	if err != nil {
		return err
	}
	l.guard = g
	return g.EnsureSchema(ctx)
}

// Close stops serving and closes the database.
func (l *Ledger) Close() error {
	_ = l.srv.Close()
	return l.db.Close()
}

// unbilled lists the customers without a charge: the batch a job run loads
// when it starts.
func (l *Ledger) unbilled(w http.ResponseWriter, r *http.Request) {
	rows, err := l.db.QueryContext(r.Context(),
		`SELECT id FROM customers WHERE id NOT IN (SELECT customer FROM charges) ORDER BY id`)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer rows.Close()
	ids := []int{}
	for rows.Next() {
		var id int
		if err := rows.Scan(&id); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		ids = append(ids, id)
	}
	writeJSON(w, ids)
}

// charge records one charge. With fencing, the token check and the insert
// are one transaction; a stale token is recorded as rejected and answered
// with 409 Conflict.
func (l *Ledger) charge(w http.ResponseWriter, r *http.Request) {
	customer, err := strconv.Atoi(r.URL.Query().Get("customer"))
	if err != nil {
		http.Error(w, "need ?customer=N", http.StatusBadRequest)
		return
	}
	worker, token, ok := writerOf(w, r)
	if !ok {
		return
	}
	l.fencedWrite(w, r, customer, worker, token, func(exec execer) error {
		_, err := exec.ExecContext(r.Context(), `INSERT INTO charges (customer, worker, token, at_ms) VALUES ($1, $2, $3, $4)`,
			customer, worker, token, l.sinceStart())
		return err
	})
}

// begin records that a holder starts a run of the job. With fencing it is
// the holder's first fenced write: from then on the ledger refuses every
// older token, so the batch the holder reads next already holds every write
// an older holder will ever get in.
func (l *Ledger) begin(w http.ResponseWriter, r *http.Request) {
	worker, token, ok := writerOf(w, r)
	if !ok {
		return
	}
	l.fencedWrite(w, r, 0, worker, token, func(exec execer) error {
		_, err := exec.ExecContext(r.Context(), `INSERT INTO runs (worker, token, at_ms) VALUES ($1, $2, $3)`, worker, token, l.sinceStart())
		return err
	})
}

// writerOf reads the writer's name (?worker=) and fencing token (header),
// answering 400 when either is missing.
func writerOf(w http.ResponseWriter, r *http.Request) (string, int64, bool) {
	token, err := strconv.ParseInt(r.Header.Get(fencing.TokenHeader), 10, 64)
	worker := r.URL.Query().Get("worker")
	if err != nil || worker == "" {
		http.Error(w, "need ?worker=NAME and the "+fencing.TokenHeader+" header", http.StatusBadRequest)
		return "", 0, false
	}
	return worker, token, true
}

// complete marks the job done.
func (l *Ledger) complete(w http.ResponseWriter, r *http.Request) {
	worker, token, ok := writerOf(w, r)
	if !ok {
		return
	}
	l.fencedWrite(w, r, 0, worker, token, func(exec execer) error {
		_, err := exec.ExecContext(r.Context(), `INSERT OR REPLACE INTO job (id, worker, token) VALUES (1, $1, $2)`, worker, token)
		return err
	})
}

type execer interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}

// fencedWrite runs write, inside the guard's transaction when fenced.
func (l *Ledger) fencedWrite(w http.ResponseWriter, r *http.Request, customer int, worker string, token int64, write func(execer) error) {
	var err error
	if l.fenced {
		err = l.guard.FenceTx(r.Context(), lockKey, token, func(tx *sql.Tx) error { return write(tx) })
	} else {
		err = write(l.db)
	}
	var stale *fencing.StaleTokenError
	switch {
	case errors.As(err, &stale):
		_, _ = l.db.ExecContext(r.Context(), `INSERT INTO rejected (customer, worker, token, current_token, at_ms) VALUES ($1, $2, $3, $4, $5)`,
			customer, worker, token, stale.Current, l.sinceStart())
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusConflict)
		writeJSON(w, fencing.StaleTokenResponse{Error: stale.Error(), Lock: stale.Lock, Token: stale.Token, CurrentToken: stale.Current})
	case err != nil:
		http.Error(w, err.Error(), http.StatusInternalServerError)
	default:
		w.WriteHeader(http.StatusCreated)
	}
}

func (l *Ledger) isComplete(w http.ResponseWriter, r *http.Request) {
	var n int
	if err := l.db.QueryRowContext(r.Context(), `SELECT count(*) FROM job`).Scan(&n); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	writeJSON(w, n > 0)
}

// stats serves Stats as JSON (for orchestrators outside the process).
func (l *Ledger) stats(w http.ResponseWriter, r *http.Request) {
	st, err := l.Stats(r.Context())
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	writeJSON(w, st)
}

// writeJSON answers v as JSON. The answers hold only strings, integers and
// booleans, so an error is a failed write: the client is gone, and there is
// no one left to tell.
func writeJSON(w http.ResponseWriter, v any) {
	_ = json.NewEncoder(w).Encode(v) //nolint:errchkjson // only the write can fail; see above
}

// Serve blocks until ctx ends, then closes the ledger.
func (l *Ledger) Serve(ctx context.Context) error {
	<-ctx.Done()
	return l.Close()
}

func (l *Ledger) sinceStart() int64 { return time.Since(l.started).Milliseconds() }
