package harness

import (
	"fmt"
	"io"
	"maps"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

// FaultMode is how a Proxy fails the connections through it.
type FaultMode int32

const (
	// PassThrough forwards everything.
	PassThrough FaultMode = iota
	// Blackhole reads and drops every byte, and answers nothing, as a
	// partitioned network does.
	Blackhole
	// Drop resets open connections and refuses new ones.
	Drop
	// Delay holds every chunk back for DelayBy before forwarding it.
	Delay
)

func (m FaultMode) String() string {
	return [...]string{"pass", "blackhole", "drop", "delay"}[m]
}

// DelayBy is how long the Delay mode holds data back: longer than any
// lease in the tests, so a delayed holder cannot renew in time.
const DelayBy = 6 * time.Second

// Proxy forwards TCP connections on a loopback port to the first of its
// targets that accepts them, failing them in the mode set with Fail. With
// several targets it is a load balancer with failover, as in front of an
// HA control plane.
type Proxy struct {
	ln      net.Listener
	targets []string
	mode    atomic.Int32

	mu     sync.Mutex
	conns  []net.Conn
	dialed map[string]int // connections forwarded, by target
}

// NewProxy listens on a free loopback port and forwards to targets
// (host:port).
func NewProxy(targets ...string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, targets: targets, dialed: map[string]int{}}
	go p.serve()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.track(c)
		go p.handle(c)
	}
}

func (p *Proxy) handle(c net.Conn) {
	switch FaultMode(p.mode.Load()) {
	case Blackhole:
		_, _ = io.Copy(io.Discard, c)
		return
	case Drop:
		resetConn(c)
		return
	case PassThrough, Delay:
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
func (p *Proxy) dial() (net.Conn, error) {
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

// DialCounts is how many connections went to each target so far.
func (p *Proxy) DialCounts() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.dialed)
}

// pipe copies src to dst until either closes, failing the bytes as the
// mode says.
func (p *Proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			switch FaultMode(p.mode.Load()) {
			case Blackhole:
				continue
			case Drop:
				resetConn(src)
				resetConn(dst)
				return
			case Delay:
				time.Sleep(DelayBy) // the network holds the data back
			case PassThrough:
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

// Fail switches the proxy to mode; Drop also resets every open connection.
func (p *Proxy) Fail(mode FaultMode) {
	p.mode.Store(int32(mode))
	if mode == Drop {
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

func (p *Proxy) track(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conns = append(p.conns, c)
}

// Restore forwards again; connections broken meanwhile are closed so that
// clients reconnect.
func (p *Proxy) Restore() {
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.mode.Store(int32(PassThrough))
}

// Close stops listening and closes every connection.
func (p *Proxy) Close() {
	p.ln.Close()
	p.Restore()
}

// ProxiedKubeconfig writes a copy of kubeconfig into dir whose server is a
// new Proxy in front of that server, and returns the proxy and the copy's
// path. The caller closes the proxy.
func ProxiedKubeconfig(kubeconfig, dir, name string) (*Proxy, string, error) {
	kc, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		return nil, "", err
	}
	if len(kc.Clusters) != 1 {
		return nil, "", fmt.Errorf("%s names %d clusters; the proxy stands in front of exactly one", kubeconfig, len(kc.Clusters))
	}
	var p *Proxy
	for _, c := range kc.Clusters {
		if p, err = NewProxy(strings.TrimPrefix(c.Server, "https://")); err != nil {
			return nil, "", err
		}
		c.Server = "https://" + p.Addr()
	}
	path := filepath.Join(dir, "kubeconfig-"+name)
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		p.Close()
		return nil, "", err
	}
	return p, path, nil
}
