package demo

import (
	"context"
	"fmt"
)

// Stats are counted from the ledger's database, never computed from the
// scenario's parameters.
type Stats struct {
	// Customers in the ledger.
	Customers int `json:"customers"`
	// Charges recorded.
	Charges int `json:"charges"`
	// Duplicates are charges beyond the first for a customer.
	Duplicates int `json:"duplicates"`
	// ChargedOnce counts customers with exactly one charge.
	ChargedOnce int `json:"chargedOnce"`
	// NeverCharged counts customers with no charge.
	NeverCharged int `json:"neverCharged"`
	// Rejected counts writes refused for a stale fencing token.
	Rejected int `json:"rejected"`
	// Complete: a worker marked the job done.
	Complete bool `json:"complete"`
	// Tokens lists, per fencing token that wrote or tried to, who and what.
	Tokens []TokenStats `json:"tokens"`
}

// TokenStats is what the holder of one fencing token did at the ledger.
type TokenStats struct {
	Token    int64  `json:"token"`
	Worker   string `json:"worker"`
	Accepted int    `json:"accepted"`
	Rejected int    `json:"rejected"`
	// FirstMS and LastMS bound its writes, in ms since the ledger started.
	FirstMS int64 `json:"firstMs"`
	LastMS  int64 `json:"lastMs"`
	// FirstChargeMS and LastChargeMS bound its accepted charges alone (0
	// when none was accepted), in ms since the ledger started.
	FirstChargeMS int64 `json:"firstChargeMs"`
	LastChargeMS  int64 `json:"lastChargeMs"`
}

// Stats counts what the ledger holds.
func (l *Ledger) Stats(ctx context.Context) (Stats, error) {
	var s Stats
	q := `SELECT
		(SELECT count(*) FROM customers),
		(SELECT count(*) FROM charges),
		(SELECT count(*) FROM charges) - (SELECT count(DISTINCT customer) FROM charges),
		(SELECT count(*) FROM (SELECT customer FROM charges GROUP BY customer HAVING count(*) = 1)),
		(SELECT count(*) FROM customers WHERE id NOT IN (SELECT customer FROM charges)),
		(SELECT count(*) FROM rejected),
		(SELECT count(*) FROM job)`
	var complete int
	if err := l.db.QueryRowContext(ctx, q).Scan(&s.Customers, &s.Charges, &s.Duplicates, &s.ChargedOnce, &s.NeverCharged, &s.Rejected, &complete); err != nil {
		return Stats{}, fmt.Errorf("counting the ledger: %w", err)
	}
	s.Complete = complete > 0
	rows, err := l.db.QueryContext(ctx, `
		SELECT token, worker, sum(accepted), sum(rejected), min(at_ms), max(at_ms),
			coalesce(min(CASE WHEN accepted = 1 THEN at_ms END), 0),
			coalesce(max(CASE WHEN accepted = 1 THEN at_ms END), 0) FROM (
			SELECT token, worker, 1 AS accepted, 0 AS rejected, at_ms FROM charges
			UNION ALL
			SELECT token, worker, 0, 1, at_ms FROM rejected)
		GROUP BY token, worker ORDER BY token, min(at_ms)`)
	if err != nil {
		return Stats{}, fmt.Errorf("counting charges per token: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var t TokenStats
		if err := rows.Scan(&t.Token, &t.Worker, &t.Accepted, &t.Rejected, &t.FirstMS, &t.LastMS, &t.FirstChargeMS, &t.LastChargeMS); err != nil {
			return Stats{}, fmt.Errorf("counting charges per token: %w", err)
		}
		s.Tokens = append(s.Tokens, t)
	}
	return s, rows.Err()
}

// chargesWithToken counts the charges accepted under one token.
func (l *Ledger) chargesWithToken(ctx context.Context, token int64) (int, error) {
	var n int
	err := l.db.QueryRowContext(ctx, `SELECT count(*) FROM charges WHERE token = $1`, token).Scan(&n)
	return n, err
}
