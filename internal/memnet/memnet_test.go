package memnet

import (
	"context"
	"errors"
	"io"
	"net/http"
	"syscall"
	"testing"
	"testing/synctest"
	"time"
)

// A real http.Server and http.Client talk over the listener inside a bubble,
// and a minute of fake time passes without real waiting.
func TestHTTPRoundTripInBubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := Listen("memnet.test")
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "pong")
		})}
		go srv.Serve(l)
		defer srv.Close()
		tr := &http.Transport{DialContext: l.Dial}
		defer tr.CloseIdleConnections()
		c := &http.Client{Transport: tr}

		start := time.Now()
		time.Sleep(time.Minute)
		resp, err := c.Get("http://memnet.test/ping")
		if err != nil {
			t.Fatalf("get: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != "pong" {
			t.Fatalf("body %q, want pong", b)
		}
		if got := time.Since(start); got != time.Minute {
			t.Fatalf("elapsed %v, want exactly 1m", got)
		}
		if l.Dials() != 1 {
			t.Fatalf("dials %d, want 1", l.Dials())
		}
	})
}

func TestDialRefusedAndUnanswered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := Listen("x")
		l.SetRefusing(true)
		if _, err := l.Dial(context.Background(), "tcp", "x:80"); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("refusing dial: %v, want ECONNREFUSED", err)
		}
		l.SetRefusing(false)
		// Nobody accepts: the dial waits for its context, like an unanswered SYN.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		start := time.Now()
		if _, err := l.Dial(ctx, "tcp", "x:80"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("unanswered dial: %v, want deadline exceeded", err)
		}
		if got := time.Since(start); got != 5*time.Second {
			t.Fatalf("unanswered dial gave up after %v, want 5s", got)
		}
		l.Close()
		if _, err := l.Dial(context.Background(), "tcp", "x:80"); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("dial after close: %v, want ECONNREFUSED", err)
		}
		if _, err := l.Accept(); err == nil {
			t.Fatal("accept after close succeeded")
		}
	})
}
