package demo

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/frontdesk-dev/frontdesk/pkg/fencing"
)

// ExitFenced is the exit status of a charger whose token the ledger
// refused: its grant is gone (the same status as `kubectl dlock run` whose
// lease was lost).
const ExitFenced = 75

// chargeOptions are the flags of `frontdesk-demo charge`.
type chargeOptions struct {
	ledger  string
	worker  string
	token   int64
	charges int
	every   time.Duration
	// giveUp is how long the ledger may stay unreachable before the
	// charger gives up.
	giveUp time.Duration
}

// ChargeMain charges the ledger as a process that runs holding the lock
// (a lock-admitted pod: the controller holds the grant on its behalf and
// the token comes in --token): it makes its first fenced write, then
// charges the next unbilled customer --charges times, one every --every,
// and returns 0. A write refused for a stale token ends it at once with
// ExitFenced; a ledger unreachable for --give-up, with 1.
func ChargeMain(args []string) int {
	fs := flag.NewFlagSet("charge", flag.ContinueOnError)
	var o chargeOptions
	fs.StringVar(&o.ledger, "ledger", "", "ledger URL")
	fs.StringVar(&o.worker, "worker", "", "who charges (the pod's name)")
	token := fs.String("token", "", "fencing token of the grant held for this process ($FENCING_TOKEN)")
	fs.IntVar(&o.charges, "charges", 70, "charges to make")
	fs.DurationVar(&o.every, "every", time.Second, "time between charges")
	fs.DurationVar(&o.giveUp, "give-up", 30*time.Second, "how long the ledger may stay unreachable")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var err error
	if o.token, err = strconv.ParseInt(*token, 10, 64); err != nil || o.token < 1 {
		fmt.Fprintf(os.Stderr, "charge: --token=%q is not a fencing token: is the pod admitted?\n", *token)
		return 2
	}
	if o.ledger == "" || o.worker == "" {
		fmt.Fprintln(os.Stderr, "charge: need --ledger and --worker")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return charge(ctx, o, os.Stdout)
}

// errFenced is a write the ledger refused for a stale token.
type errFenced struct{ current int64 }

func (e errFenced) Error() string {
	return fmt.Sprintf("refused: stale fencing token (the ledger's is %d)", e.current)
}

// charge runs the charger and returns its exit status.
func charge(ctx context.Context, o chargeOptions, out io.Writer) int {
	c := &charger{chargeOptions: o, http: &http.Client{Timeout: 10 * time.Second}}
	// Fence first, then read: once the ledger has this token, no older
	// holder's charge lands after the unbilled customers are read.
	if err := c.retry(ctx, func() error { return c.post(ctx, "/begin?worker="+url.QueryEscape(o.worker)) }); err != nil {
		return c.fail(out, "begin", err)
	}
	fmt.Fprintf(out, "begin with token %d\n", o.token)
	for n := 0; n < o.charges; n++ {
		var customer int
		err := c.retry(ctx, func() error {
			var unbilled []int
			if err := getJSON(ctx, c.http, c.ledger+"/unbilled", &unbilled); err != nil {
				return err
			}
			if len(unbilled) == 0 {
				customer = 0
				return nil
			}
			customer = unbilled[0]
			return c.post(ctx, fmt.Sprintf("/charge?customer=%d&worker=%s", customer, url.QueryEscape(o.worker)))
		})
		if err != nil {
			return c.fail(out, fmt.Sprintf("charge of customer %d", customer), err)
		}
		if customer == 0 {
			fmt.Fprintf(out, "no customer left to charge after %d charges\n", n)
			return 0
		}
		fmt.Fprintf(out, "charged customer %d with token %d\n", customer, o.token)
		select {
		case <-ctx.Done():
			return c.fail(out, "charging", ctx.Err())
		case <-time.After(o.every):
		}
	}
	fmt.Fprintf(out, "done: %d charges with token %d\n", o.charges, o.token)
	return 0
}

type charger struct {
	chargeOptions
	http *http.Client
}

// fail reports what went wrong and returns the exit status for it.
func (c *charger) fail(out io.Writer, what string, err error) int {
	fmt.Fprintf(out, "%s with token %d: %v\n", what, c.token, err)
	if errors.As(err, new(errFenced)) {
		return ExitFenced
	}
	return 1
}

// retry runs op until it succeeds, is fenced, or the ledger has been
// unreachable (or failing) for giveUp and three tries. The tries count
// too: a process frozen mid-request (its node paused) finds giveUp past
// when it thaws, and must still make its late write.
func (c *charger) retry(ctx context.Context, op func() error) error {
	deadline := time.Now().Add(c.giveUp)
	for try := 1; ; try++ {
		err := op()
		if err == nil || errors.As(err, new(errFenced)) || (try >= 3 && time.Now().After(deadline)) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// post makes a fenced write with the charger's token: nil when the ledger
// recorded it, errFenced when it refused the token.
func (c *charger) post(ctx context.Context, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.ledger+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set(fencing.TokenHeader, strconv.FormatInt(c.token, 10))
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusCreated:
		return nil
	case http.StatusConflict:
		var stale fencing.StaleTokenResponse
		_ = json.NewDecoder(resp.Body).Decode(&stale)
		return errFenced{current: stale.CurrentToken}
	default:
		return fmt.Errorf("POST %s: %s", path, resp.Status)
	}
}
