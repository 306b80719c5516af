package fencing

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"strconv"
)

// TokenHeader is the request header that carries a fencing token.
const TokenHeader = "X-Fencing-Token"

// StaleTokenResponse is the JSON body of a 409 Conflict from Middleware.
type StaleTokenResponse struct {
	// Error says what happened.
	Error string `json:"error"`
	// Lock is the fencing key the token was checked against.
	Lock string `json:"lock"`
	// Token is the rejected token.
	Token int64 `json:"token"`
	// CurrentToken is the highest token accepted so far.
	CurrentToken int64 `json:"currentToken"`
}

// FixedLock names the same fencing key for every request, e.g.
// FixedLock(LockKey("payments", "billing")).
func FixedLock(key string) func(*http.Request) string {
	return func(*http.Request) string { return key }
}

// errRequestFailed makes the guard roll back a request whose handler failed.
var errRequestFailed = errors.New("fenced request failed")

type requestStateKey struct{}

// requestState is what Abort marks.
type requestState struct {
	aborted bool
}

// Abort tells Middleware that the request being handled failed, whatever
// status it answers: its writes are rolled back (SQLGuard) and its token is
// not recorded. Call it with the request's context, from the handler, before
// it returns. Outside Middleware it does nothing.
func Abort(ctx context.Context) {
	if s, ok := ctx.Value(requestStateKey{}).(*requestState); ok {
		s.aborted = true
	}
}

// Middleware fences an HTTP handler: it reads the token from TokenHeader and
// runs next inside guard.Fence for the fencing key lockFor returns (see
// LockKey), so requests for one lock are handled one at a time and a request with a stale token never
// reaches next. A missing or malformed token is 400 Bad Request; a stale one
// is 409 Conflict with a StaleTokenResponse body naming the current token.
// With a SQLGuard, next finds the transaction with TxFrom(r.Context()).
//
// A request succeeds, and only then are its writes committed and its token
// recorded, when next answers a status below 400 (2xx or 3xx) and did not
// call Abort. Any other answer (or a panic) rolls back, so a failed request
// leaves neither its writes nor its token behind. next's response is
// buffered until that is decided: the client never sees a success whose
// writes were rolled back, and a commit that fails is answered with 503
// Service Unavailable instead. (So next cannot stream or hijack.)
func Middleware(guard Guard, lockFor func(*http.Request) string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw := r.Header.Get(TokenHeader)
		token, err := strconv.ParseInt(raw, 10, 64)
		if raw == "" || err != nil || token < 0 {
			http.Error(w, "missing or malformed "+TokenHeader+" header: send the fencing token of your lock grant as a non-negative integer", http.StatusBadRequest)
			return
		}
		lock := lockFor(r)
		state := &requestState{}
		resp := &bufferedResponse{header: http.Header{}}
		ctx := context.WithValue(r.Context(), requestStateKey{}, state)
		err = guard.Fence(ctx, lock, token, func(ctx context.Context) error {
			next.ServeHTTP(resp, r.WithContext(ctx))
			if state.aborted || resp.statusCode() >= http.StatusBadRequest {
				return errRequestFailed
			}
			return nil
		})
		var stale *StaleTokenError
		switch {
		case err == nil, errors.Is(err, errRequestFailed):
			resp.replay(w) // committed, or rolled back: next's own answer
		case errors.As(err, &stale):
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusConflict)
			_ = json.NewEncoder(w).Encode(StaleTokenResponse{
				Error: stale.Error(), Lock: stale.Lock, Token: stale.Token, CurrentToken: stale.Current})
		default:
			http.Error(w, "fencing check failed, nothing was written: "+err.Error(), http.StatusServiceUnavailable)
		}
	})
}

// bufferedResponse holds a handler's answer until the guard has committed
// or rolled back its writes.
type bufferedResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
}

// Header implements http.ResponseWriter.
func (b *bufferedResponse) Header() http.Header { return b.header }

// WriteHeader implements http.ResponseWriter. Informational (1xx) answers
// cannot be held back and are dropped.
func (b *bufferedResponse) WriteHeader(code int) {
	if b.status == 0 && code >= 200 {
		b.status = code
	}
}

// Write implements http.ResponseWriter.
func (b *bufferedResponse) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.status = http.StatusOK
	}
	return b.body.Write(p)
}

// statusCode is the answer's status, 200 when the handler set none.
func (b *bufferedResponse) statusCode() int {
	if b.status == 0 {
		return http.StatusOK
	}
	return b.status
}

// replay sends the buffered answer.
func (b *bufferedResponse) replay(w http.ResponseWriter) {
	maps.Copy(w.Header(), b.header)
	w.WriteHeader(b.statusCode())
	_, _ = w.Write(b.body.Bytes())
}
