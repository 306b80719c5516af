package fencing

import (
	"encoding/json"
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

	send := func(token string) (*http.Response, string) {
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
		return resp, string(body)
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
		resp, body := send(tc.token)
		if resp.StatusCode != tc.wantStatus || !strings.Contains(body, tc.wantBody) {
			t.Errorf("token %q: %d %q, want %d containing %q", tc.token, resp.StatusCode, body, tc.wantStatus, tc.wantBody)
		}
		if resp.StatusCode == http.StatusConflict {
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
