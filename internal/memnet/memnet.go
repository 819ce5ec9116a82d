// Package memnet is an in-memory network for tests: a net.Listener whose
// connections are net.Pipe pairs. A real http.Server serves on it and a real
// http.Client reaches it through Listener.Dial (as its transport's
// DialContext), and because no byte touches the kernel, both run inside a
// testing/synctest bubble, where fake time advances only while every
// goroutine is blocked. A loopback socket would freeze fake time.
//
// Only tests import memnet (heartbeat, settlement, runner tests). It holds
// no package-level state.
package memnet

import (
	"context"
	"net"
	"sync"
	"syscall"
)

// Listener is an in-memory net.Listener. The zero value is not usable; call
// Listen.
type Listener struct {
	addr   Addr
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once

	mu       sync.Mutex
	refusing bool
	dials    int
}

// Listen returns a listener whose address is name (any string; it is what
// Addr reports and what a URL's host may say).
func Listen(name string) *Listener {
	return &Listener{
		addr:   Addr(name),
		conns:  make(chan net.Conn),
		closed: make(chan struct{}),
	}
}

// Accept waits for the next connection made by Dial.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, &net.OpError{Op: "accept", Net: l.addr.Network(), Addr: l.addr, Err: net.ErrClosed}
	}
}

// Close stops Accept; later dials are refused. Connections already made stay
// open: their owners close them.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

// Addr is the listener's name.
func (l *Listener) Addr() net.Addr { return l.addr }

// SetRefusing makes later dials fail at once with ECONNREFUSED while on, as a
// host with nothing listening would answer.
func (l *Listener) SetRefusing(on bool) {
	l.mu.Lock()
	l.refusing = on
	l.mu.Unlock()
}

// Dials says how many connections Dial has handed to Accept so far.
func (l *Listener) Dials() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dials
}

// Dial connects to the listener; network and address are ignored, so it fits
// http.Transport.DialContext. It waits until Accept takes the connection or
// ctx ends: nobody accepting behaves like a SYN that is never answered.
func (l *Listener) Dial(ctx context.Context, network, address string) (net.Conn, error) {
	l.mu.Lock()
	refusing := l.refusing
	l.mu.Unlock()
	if refusing {
		return nil, l.dialError(syscall.ECONNREFUSED)
	}
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		l.mu.Lock()
		l.dials++
		l.mu.Unlock()
		return client, nil
	case <-l.closed:
		client.Close()
		server.Close()
		return nil, l.dialError(syscall.ECONNREFUSED)
	case <-ctx.Done():
		client.Close()
		server.Close()
		return nil, l.dialError(ctx.Err())
	}
}

func (l *Listener) dialError(err error) error {
	return &net.OpError{Op: "dial", Net: l.addr.Network(), Addr: l.addr, Err: err}
}

// Addr is a memnet address.
type Addr string

// Network is "memnet".
func (Addr) Network() string { return "memnet" }

func (a Addr) String() string { return string(a) }
