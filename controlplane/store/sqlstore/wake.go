package sqlstore

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
)

// WorkSignal returns a channel closed once a job may have become claimable
// (see store.Store): on SQLite when the single writer commits a change of
// work_signal, which the 0012 triggers bump; on PostgreSQL when this
// store's listener hears runnerd_work, which the same triggers notify at
// commit, from any replica. The first call on PostgreSQL starts the
// listener.
func (s *Store) WorkSignal() <-chan struct{} {
	if s.listen != nil {
		s.listen.start()
	}
	return s.work.wait()
}

// signal wakes every waiter at once: wait returns the channel that the
// next fire closes.
type signal struct {
	mu    sync.Mutex // guards ch and taken
	ch    chan struct{}
	taken bool // ch was handed to a waiter: fire must close it
}

func newSignal() *signal { return &signal{ch: make(chan struct{})} }

func (g *signal) wait() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.taken = true
	return g.ch
}

func (g *signal) fire() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.taken {
		return // nobody waits on ch: nothing to wake, nothing to allocate
	}
	close(g.ch)
	g.ch, g.taken = make(chan struct{}), false
}

// workChannel is the channel the 0012 triggers notify on PostgreSQL.
const workChannel = "runnerd_work"

// listener is PostgreSQL's side of WorkSignal: one connection of its own,
// outside the pool, that LISTENs on workChannel and fires the signal for
// each notification of this store's schema. Started by the first
// WorkSignal, ended by Close. Whenever it (re)starts listening it fires
// once, for what was committed while it was not.
type listener struct {
	connector driver.Connector
	sig       *signal
	observe   func(error) // WithWorkListenObserver; nil: none

	once sync.Once // starts run, or (from close) keeps it from starting
	stop context.CancelFunc
	done chan struct{} // closed when run has returned
}

func newListener(dsn string, sig *signal, observe func(error)) (*listener, error) {
	connector, err := stdlib.GetDefaultDriver().(driver.DriverContext).OpenConnector(dsn)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	return &listener{connector: connector, sig: sig, observe: observe, done: make(chan struct{})}, nil
}

func (l *listener) start() {
	l.once.Do(func() {
		var ctx context.Context
		ctx, l.stop = context.WithCancel(context.Background())
		go l.run(ctx)
	})
}

// close ends the listener and waits for it.
func (l *listener) close() {
	l.once.Do(func() { close(l.done) }) // never started: nothing runs
	if l.stop != nil {
		l.stop()
	}
	<-l.done
}

// listenPause paces reconnections after the listening connection failed
// for the n-th time in a row (from 1): 100 ms, doubling up to 10 s. Long
// polls meanwhile find work by their own re-check.
func listenPause(n int) time.Duration {
	d := 100 * time.Millisecond
	for i := 1; i < n && d < 10*time.Second; i++ {
		d *= 2
	}
	return min(d, 10*time.Second)
}

func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	for failures := 0; ; {
		listened, err := l.listen(ctx)
		if ctx.Err() != nil {
			return
		}
		if listened {
			failures = 0
		}
		failures++
		l.sig.fire() // notifications may have passed while the connection failed
		if l.observe != nil {
			l.observe(err)
		}
		t := time.NewTimer(listenPause(failures))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// listen connects, listens and fires the signal for every notification of
// its schema until the connection fails or ctx ends; listened says it got
// as far as listening.
func (l *listener) listen(ctx context.Context) (listened bool, err error) {
	dc, err := l.connector.Connect(ctx)
	if err != nil {
		return false, err
	}
	defer dc.Close()
	c, ok := dc.(*stdlib.Conn)
	if !ok {
		return false, errors.New("listen: not a pgx connection")
	}
	conn := c.Conn()
	if _, err := conn.Exec(ctx, "LISTEN "+workChannel); err != nil {
		return false, err
	}
	var schema string
	if err := conn.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		return false, err
	}
	l.sig.fire() // whatever committed before LISTEN took effect
	if l.observe != nil {
		l.observe(nil)
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return true, err
		}
		if n.Payload == schema {
			l.sig.fire()
		}
	}
}
