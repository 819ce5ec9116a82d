package retry_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/runnerd/runnerd/internal/retry"
	"github.com/runnerd/runnerd/wire"
)

const s = time.Second

// TestDo drives Policy.Do through scripted answers on fake time: when each
// try starts, which answers end the call, and what it returns.
func TestDo(t *testing.T) {
	status := func(code int, after time.Duration) error {
		return &wire.StatusError{Op: "finish", Status: code, RetryAfter: after}
	}
	transport := &wire.TransportError{Op: "finish", Err: errors.New("connection reset")}
	report := retry.Policy{Retry: []wire.RetryClass{wire.Transient, wire.ServerFault}, Wait: 5 * s, MaxWait: 20 * s}
	receipt := retry.Policy{Retry: []wire.RetryClass{wire.Transient}, Tries: 3, Wait: 5 * s}
	tests := []struct {
		name     string
		policy   retry.Policy
		answers  []error // then success
		deadline time.Duration
		at       []time.Duration
		wantErr  bool
	}{
		{"doubling to the cap", report, []error{transport, status(500, 0), status(503, 0), status(502, 0), status(504, 0)}, 0,
			[]time.Duration{0, 5 * s, 15 * s, 35 * s, 55 * s, 75 * s}, false},
		{"Retry-After longer than the pause", report, []error{status(429, 30*s)}, 0, []time.Duration{0, 30 * s}, false},
		{"Retry-After shorter than the pause", report, []error{status(429, 1*s)}, 0, []time.Duration{0, 5 * s}, false},
		{"a verdict ends it", report, []error{status(500, 0), status(409, 0)}, 0, []time.Duration{0, 5 * s}, true},
		{"a 400 ends it", report, []error{status(400, 0)}, 0, []time.Duration{0}, true},
		{"tries run out", receipt, []error{transport, transport, transport}, 0, []time.Duration{0, 5 * s, 10 * s}, true},
		{"receipts do not retry a 500", receipt, []error{status(500, 0)}, 0, []time.Duration{0}, true},
		{"receipts do not retry a 429", receipt, []error{status(429, 0)}, 0, []time.Duration{0}, true},
		{"no pause past the deadline", report, []error{transport, transport, transport}, 12 * s, []time.Duration{0, 5 * s}, true},
		{"Final ends it", report, []error{retry.Final(transport)}, 0, []time.Duration{0}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx := context.Background()
				if tt.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tt.deadline)
					defer cancel()
				}
				start := time.Now()
				var at []time.Duration
				var seen []int
				err := tt.policy.Do(ctx, func(context.Context) error {
					at = append(at, time.Since(start))
					if n := len(at); n <= len(tt.answers) {
						return tt.answers[n-1]
					}
					return nil
				}, func(f retry.Failure) { seen = append(seen, f.Try) })
				if !slices.Equal(at, tt.at) {
					t.Errorf("tries at %v, want %v", at, tt.at)
				}
				if (err != nil) != tt.wantErr {
					t.Errorf("err = %v, want error %v", err, tt.wantErr)
				}
				if err != nil && errors.Is(err, transport) != errors.Is(tt.answers[len(at)-1], transport) {
					t.Errorf("err = %v, want the last try's error", err)
				}
				if len(seen) != min(len(at), len(tt.answers)) {
					t.Errorf("observed %v failures for %d tries", seen, len(at))
				}
			})
		})
	}
}

// TestDoBoundsEachTry: each try gets its own TryTimeout.
func TestDoBoundsEachTry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := retry.Policy{Retry: []wire.RetryClass{wire.Transient}, Tries: 2, TryTimeout: 3 * s, Wait: s}
		start := time.Now()
		err := p.Do(context.Background(), func(ctx context.Context) error {
			<-ctx.Done()
			return &wire.TransportError{Op: "admission", Err: ctx.Err()}
		}, nil)
		if err == nil || time.Since(start) != 7*s {
			t.Fatalf("err %v after %v, want a timeout after 3+1+3 s", err, time.Since(start))
		}
	})
}

// TestPause: the schedule Do follows and the claim loop and launch gate
// share: Wait, doubling to MaxWait; without a larger MaxWait, constant.
func TestPause(t *testing.T) {
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
			for i, want := range tt.want {
				if got := tt.policy.Pause(i + 1); got != want {
					t.Errorf("Pause(%d) = %v, want %v", i+1, got, want)
				}
			}
		})
	}
}
