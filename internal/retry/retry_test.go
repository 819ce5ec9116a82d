package retry_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/runnerd/runnerd/internal/memnet"
	"github.com/runnerd/runnerd/internal/retry"
	"github.com/runnerd/runnerd/wire"
)

const s = time.Second

// step is one scripted answer of the test's control plane: a status (with
// Retry-After when after > 0), or, with status 0, a transport failure —
// the connection dropped once the request was read.
type step struct {
	status int
	after  time.Duration
}

var drop = step{}

func status(code int, after time.Duration) step { return step{status: code, after: after} }

// script is a real http.Server over memnet answering the steps in order,
// then 200. It notes when each request arrived and whether its body came
// whole (retryablehttp must send the body again on every try).
type script struct {
	steps []step
	start time.Time
	want  string

	mu       sync.Mutex // guards the fields below
	at       []time.Duration
	badBody  int
	answered int
}

func (sc *script) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	sc.mu.Lock()
	sc.at = append(sc.at, time.Since(sc.start))
	if string(body) != sc.want {
		sc.badBody++
	}
	n := sc.answered
	sc.answered++
	sc.mu.Unlock()
	if n >= len(sc.steps) {
		w.Write([]byte("{}"))
		return
	}
	st := sc.steps[n]
	if st.status == 0 {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
		return
	}
	if st.after > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(st.after/s)))
	}
	w.WriteHeader(st.status)
	w.Write([]byte(`{"code":"injected"}`))
}

func (sc *script) tries() []time.Duration {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return slices.Clone(sc.at)
}

// serve starts sc inside the bubble and returns the transport that reaches it.
func serve(t *testing.T, sc *script) http.RoundTripper {
	l := memnet.Listen("cp")
	hs := &http.Server{Handler: sc}
	go hs.Serve(l)
	tr := &http.Transport{DialContext: l.Dial}
	t.Cleanup(func() { hs.Close(); tr.CloseIdleConnections() })
	return tr
}

// finalOnce is a transport whose first try ends the call (a fenced lease).
type finalOnce struct {
	base http.RoundTripper
	done bool
}

var errFenced = errors.New("fenced")

func (f *finalOnce) RoundTrip(r *http.Request) (*http.Response, error) {
	if !f.done {
		f.done = true
		r.Body.Close()
		return nil, retry.Final(errFenced)
	}
	return f.base.RoundTrip(r)
}

// TestClient drives a wire call through the retryablehttp client a Policy
// builds, against a real server on fake time: when each try starts, which
// answers end the call, what it returns, and what the observer sees.
func TestClient(t *testing.T) {
	report := retry.Policy{Retry: []wire.RetryClass{wire.Transient, wire.ServerFault}, Wait: 5 * s, MaxWait: 20 * s}
	receipt := retry.Policy{Retry: []wire.RetryClass{wire.Transient}, Tries: 3, Wait: 5 * s}
	tests := []struct {
		name     string
		policy   retry.Policy
		steps    []step // then success
		deadline time.Duration
		final    bool // the first try's transport returns retry.Final
		at       []time.Duration
		wantErr  bool
	}{
		{"doubling to the cap", report, []step{drop, status(500, 0), status(503, 0), status(502, 0), status(504, 0)}, 0, false,
			[]time.Duration{0, 5 * s, 15 * s, 35 * s, 55 * s, 75 * s}, false},
		{"Retry-After longer than the pause", report, []step{status(429, 30*s)}, 0, false, []time.Duration{0, 30 * s}, false},
		{"Retry-After shorter than the pause", report, []step{status(429, 1*s)}, 0, false, []time.Duration{0, 5 * s}, false},
		{"Retry-After on a receipt", receipt, []step{status(503, 8*s)}, 0, false, []time.Duration{0, 8 * s}, false},
		{"a verdict ends it", report, []step{status(500, 0), status(409, 0)}, 0, false, []time.Duration{0, 5 * s}, true},
		{"a credential refusal ends it", report, []step{status(503, 0), status(401, 0)}, 0, false, []time.Duration{0, 5 * s}, true},
		{"a 400 ends it", report, []step{status(400, 0)}, 0, false, []time.Duration{0}, true},
		{"tries run out", receipt, []step{drop, drop, drop}, 0, false, []time.Duration{0, 5 * s, 10 * s}, true},
		{"tries run out on a status", receipt, []step{status(503, 0), status(408, 0), status(504, 0)}, 0, false, []time.Duration{0, 5 * s, 10 * s}, true},
		{"receipts do not retry a 500", receipt, []step{status(500, 0)}, 0, false, []time.Duration{0}, true},
		{"receipts do not retry a 429", receipt, []step{status(429, 0)}, 0, false, []time.Duration{0}, true},
		{"no pause past the deadline", report, []step{drop, drop, drop}, 12 * s, false, []time.Duration{0, 5 * s}, true},
		{"Final ends it", report, nil, 0, true, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				req := wire.NoticeRequest{Kind: wire.NoticeSharedWorkspaceSettled, AttemptRef: wire.AttemptRef{AttemptID: "a1"}}
				body, _ := json.Marshal(req)
				sc := &script{steps: tt.steps, start: time.Now(), want: string(body)}
				base := serve(t, sc)
				if tt.final {
					base = &finalOnce{base: base}
				}
				ctx := context.Background()
				if tt.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tt.deadline)
					defer cancel()
				}
				var seen []retry.Failure
				wc := &wire.Client{BaseURL: "http://cp", HTTP: tt.policy.HTTP(base, func(f retry.Failure) { seen = append(seen, f) })}
				err := wc.Notice(ctx, "token", "job", req)

				at := sc.tries()
				if !slices.Equal(at, tt.at) {
					t.Errorf("tries at %v, want %v", at, tt.at)
				}
				if (err != nil) != tt.wantErr {
					t.Errorf("err = %v, want error %v", err, tt.wantErr)
				}
				if sc.badBody > 0 {
					t.Errorf("%d tries without the whole body", sc.badBody)
				}
				// The error is the last try's, as the wire client types it.
				var se *wire.StatusError
				switch {
				case err == nil:
				case tt.final:
					if !errors.Is(err, errFenced) {
						t.Errorf("err = %v, want the fence's", err)
					}
				case tt.steps[len(at)-1] == drop:
					var te *wire.TransportError
					if !errors.As(err, &te) || errors.As(err, &se) {
						t.Errorf("err = %v, want the last try's transport failure", err)
					}
				default:
					if !errors.As(err, &se) || se.Status != tt.steps[len(at)-1].status || se.Code != "injected" {
						t.Errorf("err = %v, want the last try's status with its code", err)
					}
				}
				failed := min(len(at), len(tt.steps))
				if tt.final {
					failed = 1
				}
				if len(seen) != failed {
					t.Fatalf("observed %d failures for %d failed tries", len(seen), failed)
				}
				for i, f := range seen {
					want := time.Duration(0)
					if i+1 < len(at) {
						want = at[i+1] - at[i]
					}
					if f.Try != i+1 || f.Next != want || f.Class != wire.Classify(f.Err) {
						t.Errorf("failure %d: %+v, want try %d, next %v", i, f, i+1, want)
					}
				}
			})
		})
	}
}

// TestClientBoundsEachTry: each try gets its own TryTimeout.
func TestClientBoundsEachTry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := memnet.Listen("cp")
		hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			<-r.Context().Done()
		})}
		go hs.Serve(l)
		tr := &http.Transport{DialContext: l.Dial}
		defer func() { hs.Close(); tr.CloseIdleConnections() }()
		p := retry.Policy{Retry: []wire.RetryClass{wire.Transient}, Tries: 2, TryTimeout: 3 * s, Wait: s}
		start := time.Now()
		wc := &wire.Client{BaseURL: "http://cp", HTTP: p.HTTP(tr, nil)}
		_, err := wc.Admission(context.Background(), "token", "job", wire.AdmissionRequest{})
		if err == nil || time.Since(start) != 7*s || wire.Classify(err) != wire.Transient {
			t.Fatalf("err %v after %v, want a timeout after 3+1+3 s", err, time.Since(start))
		}
	})
}

// TestBackoff: the ExponentialBackOff a Policy configures for a loop of
// its own (R37's launch gate, the claim poll): Wait, doubling to MaxWait
// (without a larger MaxWait, constant), never stopping, Reset starting it
// over; with Jitter each pause varies within ±Jitter and not all alike.
func TestBackoff(t *testing.T) {
	tests := []struct {
		name   string
		policy retry.Policy
		want   []time.Duration // after 1, 2, 3, … failures
	}{
		{"doubling to the cap", retry.Policy{Wait: time.Second, MaxWait: 5 * s}, []time.Duration{s, 2 * s, 4 * s, 5 * s, 5 * s}},
		{"constant", retry.Policy{Wait: 5 * s}, []time.Duration{5 * s, 5 * s, 5 * s}},
		{"cap below the first pause", retry.Policy{Wait: 5 * s, MaxWait: s}, []time.Duration{5 * s, 5 * s}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := tt.policy.Backoff()
			for round := range 2 {
				for i, want := range tt.want {
					if got := b.NextBackOff(); got != want {
						t.Errorf("round %d: pause %d = %v, want %v", round, i+1, got, want)
					}
				}
				b.Reset()
			}
		})
	}
	t.Run("never stops", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := retry.Policy{Wait: s, MaxWait: time.Minute, Jitter: 0.2}.Backoff()
			for range 100 {
				d := b.NextBackOff()
				if d == backoff.Stop {
					t.Fatal("the backoff stopped")
				}
				time.Sleep(d)
			}
		})
	})
	t.Run("jitter", func(t *testing.T) {
		const d = 10 * time.Second
		seen := map[time.Duration]bool{}
		b := retry.Policy{Wait: d, MaxWait: time.Minute, Jitter: 0.2}.Backoff()
		for range 1000 {
			j := b.NextBackOff()
			if j < 8*time.Second || j > 12*time.Second {
				t.Fatalf("first pause %v, want %v ±20 %%", j, d)
			}
			seen[j] = true
			b.Reset()
		}
		if len(seen) < 100 {
			t.Fatalf("only %d distinct pauses in 1000", len(seen))
		}
	})
}
