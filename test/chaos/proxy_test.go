package chaos

import (
	"io"
	"maps"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// faultMode is how a proxy fails the connections through it.
type faultMode int32

const (
	// passThrough forwards everything.
	passThrough faultMode = iota
	// blackhole reads and drops every byte, and answers nothing, as a
	// partitioned network does.
	blackhole
	// drop resets open connections and refuses new ones.
	drop
	// delay holds every chunk back for delayBy before forwarding it.
	delay
)

func (m faultMode) String() string {
	return [...]string{"pass", "blackhole", "drop", "delay"}[m]
}

// delayBy is how long the delay mode holds data back: longer than any
// lease in the scenarios, so a delayed holder cannot renew in time.
const delayBy = 6 * time.Second

// proxy forwards TCP connections on a loopback port to the first of its
// targets that accepts them, failing them in the mode set with fail. With
// several targets it is a load balancer with failover, as in front of an
// HA control plane.
type proxy struct {
	ln      net.Listener
	targets []string
	mode    atomic.Int32

	mu     sync.Mutex
	conns  []net.Conn
	dialed map[string]int // connections forwarded, by target
}

func newProxy(targets ...string) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, targets: targets, dialed: map[string]int{}}
	go p.serve()
	return p, nil
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.track(c)
		go p.handle(c)
	}
}

func (p *proxy) handle(c net.Conn) {
	switch faultMode(p.mode.Load()) {
	case blackhole:
		_, _ = io.Copy(io.Discard, c)
		return
	case drop:
		resetConn(c)
		return
	}
	up, err := p.dial()
	if err != nil {
		c.Close()
		return
	}
	p.track(up)
	go p.pipe(up, c)
	p.pipe(c, up)
}

// dial connects to the first target that accepts.
func (p *proxy) dial() (net.Conn, error) {
	var err error
	for _, target := range p.targets {
		var up net.Conn
		if up, err = net.DialTimeout("tcp", target, time.Second); err == nil {
			p.mu.Lock()
			p.dialed[target]++
			p.mu.Unlock()
			return up, nil
		}
	}
	return nil, err
}

// dialCounts is how many connections went to each target so far.
func (p *proxy) dialCounts() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.dialed)
}

// pipe copies src to dst until either closes, failing the bytes as the
// mode says.
func (p *proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			switch faultMode(p.mode.Load()) {
			case blackhole:
				continue
			case drop:
				resetConn(src)
				resetConn(dst)
				return
			case delay:
				time.Sleep(delayBy) // the network holds the data back
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	dst.Close()
	src.Close()
}

// fail switches the proxy to mode; drop also resets every open connection.
func (p *proxy) fail(mode faultMode) {
	p.mode.Store(int32(mode))
	if mode == drop {
		p.mu.Lock()
		for _, c := range p.conns {
			resetConn(c)
		}
		p.conns = nil
		p.mu.Unlock()
	}
}

// resetConn closes c with a TCP reset rather than a FIN.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

func (p *proxy) track(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conns = append(p.conns, c)
}

// restore forwards again; connections broken meanwhile are closed so that
// clients reconnect.
func (p *proxy) restore() {
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.mode.Store(int32(passThrough))
}

func (p *proxy) close() {
	p.ln.Close()
	p.restore()
}
