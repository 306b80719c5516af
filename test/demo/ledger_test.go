package demo

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/frontdesk-dev/frontdesk/pkg/fencing"
)

// The ledger on its own: fenced writes in order, a stale one refused and
// recorded, and /stats counting from the database.
func TestLedgerFencesAndCounts(t *testing.T) {
	l, err := StartLedger(t.TempDir(), 3, true, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	post := func(path string, token int64) int {
		req, _ := http.NewRequest(http.MethodPost, l.URL+path, nil)
		req.Header.Set(fencing.TokenHeader, fmt.Sprint(token))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	steps := []struct {
		path  string
		token int64
		want  int
	}{
		{"/begin?worker=a", 1, http.StatusCreated},
		{"/charge?customer=1&worker=a", 1, http.StatusCreated},
		{"/begin?worker=b", 2, http.StatusCreated},
		{"/charge?customer=2&worker=a", 1, http.StatusConflict}, // a paused holder, after b's begin
		{"/charge?customer=2&worker=b", 2, http.StatusCreated},
		{"/charge?customer=3&worker=b", 2, http.StatusCreated},
		{"/complete?worker=b", 2, http.StatusCreated},
		{"/charge", 2, http.StatusBadRequest},
	}
	for _, s := range steps {
		if got := post(s.path, s.token); got != s.want {
			t.Errorf("POST %s with token %d: %d, want %d", s.path, s.token, got, s.want)
		}
	}
	resp, err := http.Get(l.URL + "/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st Stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	if st.Customers != 3 || st.Charges != 3 || st.Duplicates != 0 || st.ChargedOnce != 3 || st.Rejected != 1 || !st.Complete {
		t.Errorf("stats = %+v", st)
	}
}
