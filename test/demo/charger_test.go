package demo

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/frontdesk-dev/frontdesk/pkg/fencing"
)

// A charger charges the next unbilled customers with its token; once a
// newer holder has written to the ledger, its next charge is refused and
// recorded, and it stops with ExitFenced.
func TestChargerStopsWhenFenced(t *testing.T) {
	l, err := StartLedger(t.TempDir(), 100, true, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()

	var out bytes.Buffer
	if code := charge(ctx, chargeOptions{ledger: l.URL, worker: "a", token: 1, charges: 3, every: time.Millisecond, giveUp: time.Second}, &out); code != 0 {
		t.Fatalf("charger a (token 1): exit %d\n%s", code, out.String())
	}

	// b holds token 2 and keeps charging until c's first fenced write.
	done := make(chan int)
	var bOut bytes.Buffer
	go func() {
		done <- charge(ctx, chargeOptions{ledger: l.URL, worker: "b", token: 2, charges: 10000, every: 5 * time.Millisecond, giveUp: time.Second}, &bOut)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for n, _ := l.chargesWithToken(ctx, 2); n < 2; n, _ = l.chargesWithToken(ctx, 2) {
		if time.Now().After(deadline) {
			t.Fatalf("charger b made %d charges in 10s", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	req, _ := http.NewRequest(http.MethodPost, l.URL+"/begin?worker=c", nil)
	req.Header.Set(fencing.TokenHeader, "3")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	select {
	case code := <-done:
		if code != ExitFenced {
			t.Errorf("charger b after token 3 was seen: exit %d, want %d\n%s", code, ExitFenced, bOut.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("charger b still runs 10s after token 3 was seen")
	}
	if !strings.Contains(bOut.String(), "stale fencing token (the ledger's is 3)") {
		t.Errorf("charger b's output does not say why it stopped:\n%s", bOut.String())
	}

	st, err := l.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Duplicates != 0 || st.Rejected != 1 {
		t.Errorf("stats = %+v, want 0 duplicates and 1 rejected", st)
	}
	if len(st.Tokens) != 2 {
		t.Fatalf("tokens = %+v, want a (1) and b (2)", st.Tokens)
	}
	a, b := st.Tokens[0], st.Tokens[1]
	if a.Token != 1 || a.Worker != "a" || a.Accepted != 3 || a.Rejected != 0 {
		t.Errorf("token 1 = %+v, want worker a, 3 accepted", a)
	}
	if b.Token != 2 || b.Worker != "b" || b.Accepted < 2 || b.Rejected != 1 {
		t.Errorf("token 2 = %+v, want worker b, at least 2 accepted, 1 rejected", b)
	}
	if b.FirstChargeMS < a.LastChargeMS || b.LastChargeMS > b.LastMS || b.FirstChargeMS != b.FirstMS || b.FirstChargeMS > b.LastChargeMS {
		t.Errorf("charge bounds: a %+v, b %+v", a, b)
	}
	if st.Charges != 3+b.Accepted {
		t.Errorf("charges = %d, want %d", st.Charges, 3+b.Accepted)
	}
}

// A charger without a token refuses to run, and one that finds every
// customer billed stops.
func TestChargerFlagsAndNoCustomers(t *testing.T) {
	if code := ChargeMain([]string{"--ledger=http://127.0.0.1:1", "--worker=a", "--token="}); code != 2 {
		t.Errorf("no token: exit %d, want 2", code)
	}
	l, err := StartLedger(t.TempDir(), 2, true, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var out bytes.Buffer
	if code := charge(context.Background(), chargeOptions{ledger: l.URL, worker: "a", token: 1, charges: 5, every: time.Millisecond, giveUp: time.Second}, &out); code != 0 {
		t.Fatalf("exit %d\n%s", code, out.String())
	}
	if want := fmt.Sprintf("no customer left to charge after %d charges", 2); !strings.Contains(out.String(), want) {
		t.Errorf("output:\n%s\nwant %q", out.String(), want)
	}
}
