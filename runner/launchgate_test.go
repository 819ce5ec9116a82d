package runner

import (
	"testing"
	"testing/synctest"
	"time"
)

// R37: launch failures below the threshold do not pause claiming; from the
// threshold on each failure pauses it, the pause grows exponentially (with
// jitter) up to the maximum, the heartbeat's launch_error carries the class,
// the count and since when, and the first good launch clears it all.
func TestR37LaunchGateBacksOffAndResets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const jit = 0.2
		g := newLaunchGate(3, time.Second, 8*time.Second, jit)
		start := time.Now()
		if g.report() != nil {
			t.Fatal("launch_error before any failure")
		}
		for i := 1; i <= 2; i++ {
			if p := g.failure("declined:image_missing", time.Now()); p != 0 {
				t.Fatalf("failure %d paused %v below the threshold", i, p)
			}
			if g.pause(time.Now()) != 0 {
				t.Fatalf("paused after failure %d", i)
			}
			time.Sleep(time.Second)
		}
		// From the threshold: 1, 2, 4, 8, 8 s, each ±20 %.
		for i, base := range []time.Duration{1, 2, 4, 8, 8} {
			base *= time.Second
			p := g.failure("spawn_failed", time.Now())
			lo, hi := time.Duration(float64(base)*(1-jit)), time.Duration(float64(base)*(1+jit))
			if p < lo || p > hi {
				t.Fatalf("pause %d = %v, want %v..%v", i, p, lo, hi)
			}
			if got := g.pause(time.Now()); got != p {
				t.Fatalf("pause(now) = %v, want %v", got, p)
			}
			time.Sleep(p / 2)
			if got := g.pause(time.Now()); got != p-p/2 {
				t.Fatalf("halfway pause = %v, want %v", got, p-p/2)
			}
			time.Sleep(p - p/2)
			if got := g.pause(time.Now()); got != 0 {
				t.Fatalf("pause after it elapsed = %v", got)
			}
		}
		le := g.report()
		if le == nil || le.Class != "spawn_failed" || le.Consecutive != 7 || !le.Since.Equal(start) {
			t.Fatalf("launch_error %+v, want spawn_failed ×7 since %v", le, start)
		}

		g.success()
		if g.report() != nil || g.pause(time.Now()) != 0 {
			t.Fatalf("after success: report %+v pause %v", g.report(), g.pause(time.Now()))
		}
		// A new run of failures starts over: since is new, the backoff is reset.
		time.Sleep(time.Minute)
		again := time.Now()
		g.failure("declined:closed", again)
		g.failure("declined:closed", again)
		p := g.failure("declined:closed", again)
		if p < 800*time.Millisecond || p > 1200*time.Millisecond {
			t.Fatalf("first pause of a new run %v, want about 1s", p)
		}
		if le := g.report(); le.Consecutive != 3 || !le.Since.Equal(again) {
			t.Fatalf("new run's launch_error %+v", le)
		}
	})
}

// R37: the launch gate's backoff is configured as the daemon says — its
// randomisation factor is the jitter (pauses vary within ±jitter, and not
// all alike; none without jitter), its maximum interval the longest pause
// however long the run of failures, and each success starts it over.
func TestR37LaunchGateJitterAndCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		exact := newLaunchGate(1, time.Second, 8*time.Second, 0)
		for i, want := range []time.Duration{1, 2, 4, 8, 8, 8} {
			if got := exact.failure("spawn_failed", time.Now()); got != want*time.Second {
				t.Fatalf("without jitter, pause %d = %v, want %v", i, got, want*time.Second)
			}
		}

		const jit = 0.2
		g := newLaunchGate(1, time.Second, 8*time.Second, jit)
		firsts := map[time.Duration]bool{}
		for run := range 200 {
			for i := range 20 {
				p := g.failure("spawn_failed", time.Now())
				base := min(time.Second<<i, 8*time.Second)
				if lo, hi := time.Duration(float64(base)*(1-jit)), time.Duration(float64(base)*(1+jit)); p < lo || p > hi {
					t.Fatalf("run %d, pause %d = %v, want %v..%v", run, i, p, lo, hi)
				}
				if i == 0 {
					firsts[p] = true
				}
			}
			g.success()
		}
		if len(firsts) < 50 {
			t.Fatalf("only %d distinct first pauses in 200 runs: no jitter", len(firsts))
		}
	})
}
