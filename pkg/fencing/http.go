package fencing

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
)

// TokenHeader is the request header that carries a fencing token.
const TokenHeader = "X-Fencing-Token"

// StaleTokenResponse is the JSON body of a 409 Conflict from Middleware.
type StaleTokenResponse struct {
	// Error says what happened.
	Error string `json:"error"`
	// Lock is the lock the token belongs to.
	Lock string `json:"lock"`
	// Token is the rejected token.
	Token int64 `json:"token"`
	// CurrentToken is the highest token accepted so far.
	CurrentToken int64 `json:"currentToken"`
}

// FixedLock names the same lock for every request.
func FixedLock(name string) func(*http.Request) string {
	return func(*http.Request) string { return name }
}

// Middleware fences an HTTP handler: it reads the token from TokenHeader and
// runs next inside guard.Fence for the request's lock, so requests for one
// lock are handled one at a time and a request with a stale token never
// reaches next. A missing or malformed token is 400 Bad Request; a stale one
// is 409 Conflict with a StaleTokenResponse body naming the current token.
// With a SQLGuard, next finds the transaction with TxFrom(r.Context()).
func Middleware(guard Guard, lockFor func(*http.Request) string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw := r.Header.Get(TokenHeader)
		token, err := strconv.ParseInt(raw, 10, 64)
		if raw == "" || err != nil || token < 0 {
			http.Error(w, "missing or malformed "+TokenHeader+" header: send the fencing token of your lock grant as a non-negative integer", http.StatusBadRequest)
			return
		}
		lock := lockFor(r)
		err = guard.Fence(r.Context(), lock, token, func(ctx context.Context) error {
			next.ServeHTTP(w, r.WithContext(ctx))
			return nil
		})
		var stale *StaleTokenError
		switch {
		case errors.As(err, &stale):
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusConflict)
			_ = json.NewEncoder(w).Encode(StaleTokenResponse{
				Error: stale.Error(), Lock: stale.Lock, Token: stale.Token, CurrentToken: stale.Current})
		case err != nil:
			http.Error(w, "fencing check failed: "+err.Error(), http.StatusServiceUnavailable)
		}
	})
}
