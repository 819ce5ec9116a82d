package integration

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// proxy is a TCP proxy between a daemon (and its turn children) and the
// control plane that can be told to black-hole: from then on it reads what
// it is sent and answers nothing, on the connections already open and on
// new ones, like a network path that silently drops packets. Lifting the
// black hole forwards new connections again; the held ones stay dead, as
// they would behind a real outage.
type proxy struct {
	ln     net.Listener
	target string
	holed  atomic.Bool

	mu    sync.Mutex
	pairs map[*pair]struct{}
	wg    sync.WaitGroup
}

type pair struct {
	client, up net.Conn
	holed      atomic.Bool
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, pairs: map[*pair]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// URL is the base address the daemon is given.
func (p *proxy) URL() string { return "http://" + p.ln.Addr().String() }

// blackhole starts (true) or lifts (false) the black hole.
func (p *proxy) blackhole(on bool) {
	p.holed.Store(on)
	if !on {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for pr := range p.pairs {
		if pr.up != nil && !pr.holed.Swap(true) {
			pr.up.Close()
		}
	}
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		pr := &pair{client: c}
		if p.holed.Load() {
			pr.holed.Store(true)
		} else if up, err := net.Dial("tcp", p.target); err == nil {
			pr.up = up
		} else {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.pairs[pr] = struct{}{}
		if p.holed.Load() && pr.up != nil && !pr.holed.Swap(true) {
			pr.up.Close() // black-holed while it was being dialled
		}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.clientToUp(pr)
		go p.upToClient(pr)
	}
}

func (p *proxy) clientToUp(pr *pair) {
	defer p.wg.Done()
	if pr.up != nil {
		_, _ = io.Copy(pr.up, pr.client)
	}
	if pr.holed.Load() {
		// Swallow whatever the client still sends, answer nothing.
		_, _ = io.Copy(io.Discard, pr.client)
	}
	pr.client.Close()
	if pr.up != nil {
		pr.up.Close()
	}
	p.mu.Lock()
	delete(p.pairs, pr)
	p.mu.Unlock()
}

func (p *proxy) upToClient(pr *pair) {
	defer p.wg.Done()
	if pr.up == nil {
		return
	}
	_, _ = io.Copy(pr.client, pr.up)
	if !pr.holed.Load() {
		pr.client.Close() // the server closed: pass it on
	}
}

func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for pr := range p.pairs {
		pr.client.Close()
		if pr.up != nil {
			pr.up.Close()
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
}
