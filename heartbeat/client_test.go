package heartbeat_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/heartbeat"
	"github.com/runnerd/runnerd/internal/memnet"
	"github.com/runnerd/runnerd/wire"
)

// R3: connect, TLS handshake, each write, each read and the whole request
// have separate limits; each phase stuck alone fails at its own. The read
// limit is not the request's: it bounds the wait for the answer's first
// byte after the write, then for each further piece; an answer that keeps
// trickling in is ended by the request limit.
func TestR3SeparateLimits(t *testing.T) {
	cfg := heartbeat.HTTPConfig{
		DialTimeout:         2 * time.Second,
		WriteTimeout:        3 * time.Second,
		TLSHandshakeTimeout: 4 * time.Second,
		ReadTimeout:         6 * time.Second,
		PoolTimeout:         time.Second, // shorter than the dial: a dial is no pool wait
		RequestTimeout:      10 * time.Second,
	}
	// Peers, each stuck in one phase. They run on l until it closes.
	neverAccept := func(*testing.T, *memnet.Listener) {}
	acceptNeverRead := func(_ *testing.T, l *memnet.Listener) {
		go func() {
			var held []net.Conn
			defer func() {
				for _, c := range held {
					c.Close()
				}
			}()
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				held = append(held, c)
			}
		}()
	}
	readNeverWrite := func(_ *testing.T, l *memnet.Listener) {
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go func() { io.Copy(io.Discard, c); c.Close() }()
			}
		}()
	}
	serve := func(h http.HandlerFunc) func(*testing.T, *memnet.Listener) {
		return func(t *testing.T, l *memnet.Listener) {
			srv := &http.Server{Handler: h}
			go srv.Serve(l)
			t.Cleanup(func() { srv.Close() })
		}
	}
	tests := []struct {
		name   string
		scheme string
		peer   func(*testing.T, *memnet.Listener)
		after  time.Duration
	}{
		{"dial", "http", neverAccept, 2 * time.Second},
		{"write", "http", acceptNeverRead, 3 * time.Second},
		{"tls handshake", "https", readNeverWrite, 4 * time.Second},
		{"read: the answer's first byte", "http", serve(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body) // then the server notices the client leaving
			<-r.Context().Done()
		}), 6 * time.Second},
		{"read: the answer stops halfway", "http", serve(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			time.Sleep(time.Second)
			w.WriteHeader(http.StatusOK)
			io.WriteString(w, `{"lease_ttl_ms":`)
			w.(http.Flusher).Flush()
			time.Sleep(2 * time.Second)
			io.WriteString(w, ` `)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}), 1*time.Second + 2*time.Second + 6*time.Second},
		{"whole request", "http", serve(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.WriteHeader(http.StatusOK)
			io.WriteString(w, `{"lease_ttl_ms":`)
			for {
				w.(http.Flusher).Flush()
				select {
				case <-r.Context().Done():
					return
				case <-time.After(time.Second):
					io.WriteString(w, " ")
				}
			}
		}), 10 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := memnet.Listen(host)
				defer l.Close()
				tt.peer(t, l)
				c := cfg
				c.DialContext = l.Dial
				c.TLSClientConfig = &tls.Config{ServerName: host}
				hc := heartbeat.NewHTTPClient(c)
				defer hc.CloseIdleConnections()
				wc := &wire.Client{BaseURL: tt.scheme + "://" + host, HTTP: hc}
				start := time.Now()
				_, err := wc.Renew(context.Background(), token, jobID, wire.RenewRequest{})
				if got := time.Since(start); got != tt.after {
					t.Fatalf("failed after %v (%v), want %v", got, err, tt.after)
				}
				if class := diagnostics.Class(err); class != diagnostics.ClassTimeout {
					t.Fatalf("class %q (%v), want timeout", class, err)
				}
			})
		})
	}
}

// R3: the wait for a pooled connection has its own limit. With the pool
// full (one connection, held by a request without limits), a renewal gives
// up after exactly PoolTimeout (3 s, well before its 10 s overall limit),
// with a timeout, without reaching the server; once the connection is
// free, the next renewal rides it.
func TestR3PoolWaitIsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := memnet.Listen(host)
		release := make(chan struct{})
		arrivals := make(chan struct{}, 10)
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			arrivals <- struct{}{}
			<-release
		})}
		go srv.Serve(l)
		defer srv.Close()
		defer close(release)
		hc := heartbeat.NewHTTPClient(heartbeat.HTTPConfig{
			DialContext: l.Dial, MaxConnsPerHost: 1, ReadTimeout: time.Hour, PoolTimeout: 3 * time.Second,
		})
		defer hc.CloseIdleConnections()
		holder := &http.Client{Transport: hc.Transport} // same pool, no overall limit
		go func() {
			req, _ := http.NewRequest(http.MethodPost, "http://"+host+"/hold", nil)
			if resp, err := holder.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		<-arrivals
		time.Sleep(time.Second)
		start := time.Now()
		_, err := (&wire.Client{BaseURL: "http://" + host, HTTP: hc}).Renew(context.Background(), token, jobID, wire.RenewRequest{})
		if got := time.Since(start); got != 3*time.Second || diagnostics.Class(err) != diagnostics.ClassTimeout || wire.Classify(err) != wire.Transient {
			t.Fatalf("renewal waiting for the pool ended after %v with %v (%v), want a transient timeout after 3s", got, err, wire.Classify(err))
		}
		var pt *heartbeat.PhaseTimeout
		if !errors.As(err, &pt) || pt.Phase != "pool wait" {
			t.Fatalf("err %v, want the pool wait's own timeout", err)
		}
		if len(arrivals) != 0 {
			t.Fatal("the renewal reached the server though the pool was full")
		}
	})
}

// R3, Kubernetes issue 48638: healthy renewals reuse one connection; after
// two consecutive failures the renewer drops idle connections, so the next
// renewal does not ride a connection that may be stuck.
func TestR3IdleConnectionsDroppedAfterConsecutiveFailures(t *testing.T) {
	tests := []struct {
		name      string
		resetN    int
		failures  int
		wantDials int
	}{
		{"healthy reuses one connection", 0, 0, 1},
		{"one failure keeps it", 0, 1, 1},
		{"two failures drop it", 0, 2, 2},
		{"reset disabled keeps it", 1000, 2, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, func(_ string, n int, _ time.Duration) reply {
					if n >= 3 && n < 3+tt.failures {
						return reply{status: 503} // an answer: the connection stays pooled
					}
					return reply{}
				})
				cfg := e.config()
				cfg.IdleResetAfter = tt.resetN
				r := e.start(cfg, e.attempt(jobID))
				aliveAfter(t, r, 6*time.Minute)
				if got := e.l.Dials(); got != tt.wantDials {
					t.Fatalf("%d connections dialled, want %d", got, tt.wantDials)
				}
			})
		})
	}
}
