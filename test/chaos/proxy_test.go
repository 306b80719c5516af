package chaos

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
)

// proxy forwards TCP connections on a loopback port to target. Cut makes it
// a black hole: open connections stall (bytes are read and dropped) and new
// ones are accepted and never answered, as a partitioned network would do.
type proxy struct {
	ln     net.Listener
	target string
	cut    atomic.Bool

	mu    sync.Mutex
	conns []net.Conn
}

func newProxy(target string) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, target: target}
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
	if p.cut.Load() {
		_, _ = io.Copy(io.Discard, c) // black hole
		return
	}
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.track(up)
	go p.pipe(up, c)
	p.pipe(c, up)
}

// pipe copies src to dst until either closes, dropping bytes while cut.
func (p *proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.cut.Load() {
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
	p.cut.Store(false)
}

func (p *proxy) close() {
	p.ln.Close()
	p.restore()
}
