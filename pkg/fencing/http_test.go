package fencing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

func TestMiddleware(t *testing.T) {
	guard := NewMemoryGuard()
	writes := 0
	srv := httptest.NewServer(Middleware(guard, FixedLock("billing"), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writes++
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()

	send := func(token string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/charges", nil)
		if token != "" {
			req.Header.Set(TokenHeader, token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}

	cases := []struct {
		token      string
		wantStatus int
		wantBody   string
	}{
		{"7", http.StatusCreated, ""},
		{"8", http.StatusCreated, ""},
		{"7", http.StatusConflict, `"currentToken":8`},
		{"", http.StatusBadRequest, "missing or malformed X-Fencing-Token"},
		{"seven", http.StatusBadRequest, "non-negative integer"},
		{"-1", http.StatusBadRequest, "non-negative integer"},
		{"8", http.StatusCreated, ""},
	}
	for _, tc := range cases {
		status, body := send(tc.token)
		if status != tc.wantStatus || !strings.Contains(body, tc.wantBody) {
			t.Errorf("token %q: %d %q, want %d containing %q", tc.token, status, body, tc.wantStatus, tc.wantBody)
		}
		if status == http.StatusConflict {
			var stale StaleTokenResponse
			if err := json.Unmarshal([]byte(body), &stale); err != nil {
				t.Errorf("409 body is not JSON: %v", err)
			}
			if stale.Lock != "billing" || stale.Token != 7 || stale.CurrentToken != 8 {
				t.Errorf("409 body = %+v", stale)
			}
		}
	}
	if writes != 3 {
		t.Errorf("handler ran %d times, want 3 (only current tokens)", writes)
	}
}

// A request whose handler fails (4xx/5xx, or Abort) leaves neither its
// writes nor its token: the next request with a lower token than the failed
// one is still accepted. 2xx and 3xx commit.
func TestMiddlewareCommitsOnlySuccessfulRequests(t *testing.T) {
	for name, mk := range guards() {
		t.Run(name, func(t *testing.T) {
			guard, inc, read := mk(t)
			srv := httptest.NewServer(Middleware(guard, FixedLock("billing"), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if err := inc(r.Context()); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				if r.URL.Query().Get("abort") != "" {
					Abort(r.Context())
				}
				status, _ := strconv.Atoi(r.URL.Query().Get("status"))
				w.Header().Set("X-Handler", "ran")
				w.WriteHeader(status)
				fmt.Fprintf(w, "handler answered %d", status)
			})))
			defer srv.Close()
			noRedirects := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

			steps := []struct {
				token, query string
				wantStatus   int
				wantBody     string
				committed    bool
			}{
				{"5", "status=201", http.StatusCreated, "handler answered 201", true},
				{"9", "status=500", http.StatusInternalServerError, "handler answered 500", false},
				{"6", "status=201", http.StatusCreated, "handler answered 201", true}, // 9 was not recorded
				{"9", "status=404", http.StatusNotFound, "handler answered 404", false},
				{"9", "status=200&abort=1", http.StatusOK, "handler answered 200", false},
				{"7", "status=200", http.StatusOK, "handler answered 200", true},
				{"8", "status=303", http.StatusSeeOther, "handler answered 303", true},
				{"7", "status=200", http.StatusConflict, `"currentToken":8`, false},
			}
			committed := 0
			for i, s := range steps {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/charges?"+s.query, nil)
				req.Header.Set(TokenHeader, s.token)
				req.Header.Set("Location", "/elsewhere")
				resp, err := noRedirects.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != s.wantStatus || !strings.Contains(string(body), s.wantBody) {
					t.Errorf("step %d (token %s, %s): %d %q, want %d containing %q", i, s.token, s.query, resp.StatusCode, body, s.wantStatus, s.wantBody)
				}
				if s.wantStatus != http.StatusConflict && resp.Header.Get("X-Handler") != "ran" {
					t.Errorf("step %d: the handler's headers were not passed on: %v", i, resp.Header)
				}
				if s.committed {
					committed++
				}
				if name == "sqlite" {
					if got := read(); got != committed {
						t.Errorf("step %d (token %s, %s): %d writes committed, want %d", i, s.token, s.query, got, committed)
					}
				}
			}
		})
	}
}

// commitFailsGuard runs the operation and then fails as a commit would.
type commitFailsGuard struct{}

func (commitFailsGuard) Fence(ctx context.Context, lock string, token int64, fn func(ctx context.Context) error) error {
	if err := fn(ctx); err != nil {
		return err
	}
	return errors.New("committing fenced transaction: disk I/O error")
}

// The client never sees a success whose writes did not commit.
func TestMiddlewareAnswers503WhenCommitFails(t *testing.T) {
	srv := httptest.NewServer(Middleware(commitFailsGuard{}, FixedLock("billing"), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "charged")
	})))
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL, nil)
	req.Header.Set(TokenHeader, "4")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || strings.Contains(string(body), "charged") ||
		!strings.Contains(string(body), "disk I/O error") {
		t.Errorf("got %d %q, want 503 saying the commit failed, without the handler's answer", resp.StatusCode, body)
	}
}
