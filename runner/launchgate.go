package runner

import (
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/runnerd/runnerd/internal/retry"
	"github.com/runnerd/runnerd/wire"
)

// launchGate keeps R37: consecutive launch failures (spawn failed, payload
// undelivered, declined) stop claims on this host and back off
// exponentially (a cenkalti/backoff ExponentialBackOff: doubling from the
// first pause to the longest, each spread by the jitter); the first good
// launch resets it. The run of failures is
// what host heartbeats report as launch_error.
type launchGate struct {
	threshold int // failures in a row before claiming pauses

	mu          sync.Mutex                  // guards the fields below
	pauses      *backoff.ExponentialBackOff // the pause schedule once past the threshold
	consecutive int
	class       string
	since       time.Time
	pausedUntil time.Time
}

func newLaunchGate(threshold int, initial, max time.Duration, jitter float64) *launchGate {
	// Never gives up: a host keeps trying.
	launches := retry.Policy{Name: "launch", Wait: initial, MaxWait: max, Jitter: jitter}
	return &launchGate{threshold: threshold, pauses: launches.Backoff()}
}

// failure records a launch failure of the given class and returns how long
// claiming pauses (zero while below the threshold).
func (g *launchGate) failure(class string, now time.Time) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.consecutive == 0 {
		g.since = now
	}
	g.consecutive++
	g.class = class
	if g.consecutive < g.threshold {
		return 0
	}
	d := g.pauses.NextBackOff()
	g.pausedUntil = now.Add(d)
	return d
}

// success clears the run of failures.
func (g *launchGate) success() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.consecutive, g.class, g.since, g.pausedUntil = 0, "", time.Time{}, time.Time{}
	g.pauses.Reset()
}

// pause is how long claiming must still wait at now.
func (g *launchGate) pause(now time.Time) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	if d := g.pausedUntil.Sub(now); d > 0 {
		return d
	}
	return 0
}

// report is the launch_error of a host heartbeat, nil when launches are healthy.
func (g *launchGate) report() *wire.LaunchError {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.consecutive == 0 {
		return nil
	}
	return &wire.LaunchError{Class: g.class, Consecutive: g.consecutive, Since: g.since}
}
