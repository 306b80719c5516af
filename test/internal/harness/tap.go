package harness

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"sync"
	"time"
)

// Action is what a Tap does with one request.
type Action struct {
	// Delay holds the request this long before it is forwarded (a slow
	// network or apiserver: the write lands late).
	Delay time.Duration
	// LoseAnswer forwards the request (a write is stored), then drops the
	// answer and fails the request once its context ends, as a client
	// whose answer was lost sees a timeout.
	LoseAnswer bool
	// CutOff never forwards the request and fails it once its context ends,
	// as a partitioned client sees.
	CutOff bool
	// Gate, when not nil, forwards the request but holds back what its
	// answer's body delivers while the gate is shut (a stalled watch
	// stream: a client's cache falls behind).
	Gate *Gate
}

// Gate holds back the answers of the requests given it while it is shut.
type Gate struct {
	mu   sync.Mutex
	open chan struct{} // closed while the gate is open
}

// NewGate returns an open gate.
func NewGate() *Gate {
	g := &Gate{open: make(chan struct{})}
	close(g.open)
	return g
}

// Shut holds back what the gated answers deliver from now on.
func (g *Gate) Shut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
		g.open = make(chan struct{})
	default:
	}
}

// Open lets the gated answers through again, what was held back first.
func (g *Gate) Open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

// wait returns once the gate is open, or ctx ended.
func (g *Gate) wait(ctx context.Context) error {
	g.mu.Lock()
	open := g.open
	g.mu.Unlock()
	select {
	case <-open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Request is one request that went through a Tap.
type Request struct {
	Method string
	// Path is the URL path; Query its raw query.
	Path, Query string
	// Body is the request body (JSON when the client sends JSON).
	Body []byte
	// Sent is when the request reached the tap, before any Delay; Answered
	// when its answer came back from the apiserver (zero if it never did).
	Sent, Answered time.Time
	// Status is the answer's HTTP status (0 without an answer).
	Status int
}

// Tap sits in a client's transport (rest.Config.WrapTransport) and sees
// every request at the HTTP level, which the TCP Proxy cannot (the
// apiserver speaks TLS). It records requests and fails them as Decide
// says; by default it forwards everything.
type Tap struct {
	mu       sync.Mutex
	decide   func(*Request) Action
	requests []Request
}

// NewTap returns a Tap that forwards everything.
func NewTap() *Tap { return &Tap{} }

// Decide sets what the Tap does with each later request; f sees the
// request before it is sent (Answered unset) and may be called from many
// goroutines at once.
func (t *Tap) Decide(f func(*Request) Action) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.decide = f
}

// Requests is every request answered (or failed) so far, in the order
// their answers came.
func (t *Tap) Requests() []Request {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]Request(nil), t.requests...)
}

// Wrap is a rest.Config.WrapTransport.
func (t *Tap) Wrap(next http.RoundTripper) http.RoundTripper {
	return tapTransport{tap: t, next: next}
}

type tapTransport struct {
	tap  *Tap
	next http.RoundTripper
}

func (tt tapTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	r := Request{Method: req.Method, Path: req.URL.Path, Query: req.URL.RawQuery, Sent: time.Now()}
	if req.Body != nil && req.GetBody != nil {
		body, err := req.GetBody()
		if err == nil {
			r.Body, _ = io.ReadAll(body)
			body.Close()
		}
	}
	tt.tap.mu.Lock()
	decide := tt.tap.decide
	tt.tap.mu.Unlock()
	var act Action
	if decide != nil {
		act = decide(&r)
	}
	resp, err := tt.forward(req, act)
	if resp != nil {
		r.Status = resp.StatusCode
		r.Answered = time.Now()
	}
	tt.tap.mu.Lock()
	tt.tap.requests = append(tt.tap.requests, r)
	tt.tap.mu.Unlock()
	return resp, err
}

// CancelRequest passes a cancellation on to the wrapped transport (client-go
// calls it on timeouts; requests the tap holds end with their context).
func (tt tapTransport) CancelRequest(req *http.Request) {
	if c, ok := tt.next.(interface{ CancelRequest(*http.Request) }); ok {
		c.CancelRequest(req)
	}
}

// forward sends req on as act says.
func (tt tapTransport) forward(req *http.Request, act Action) (*http.Response, error) {
	ctx := req.Context()
	if act.CutOff {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if act.Delay > 0 {
		select {
		case <-time.After(act.Delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	resp, err := tt.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	switch {
	case act.LoseAnswer:
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		<-ctx.Done()
		return nil, ctx.Err()
	case act.Gate != nil:
		resp.Body = gatedBody{ReadCloser: resp.Body, ctx: ctx, gate: act.Gate}
	}
	return resp, nil
}

// gatedBody is an answer body that delivers nothing while its gate is shut.
type gatedBody struct {
	io.ReadCloser
	ctx  context.Context
	gate *Gate
}

// Read waits for the gate before and after reading: data that arrives
// while the gate is shut is held until it opens.
func (b gatedBody) Read(p []byte) (int, error) {
	if err := b.gate.wait(b.ctx); err != nil {
		return 0, err
	}
	n, err := b.ReadCloser.Read(p)
	if werr := b.gate.wait(b.ctx); werr != nil {
		return 0, werr
	}
	return n, err
}

// BodyContains reports whether the request's body contains s.
func (r *Request) BodyContains(s string) bool { return bytes.Contains(r.Body, []byte(s)) }
