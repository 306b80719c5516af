package fencing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
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
