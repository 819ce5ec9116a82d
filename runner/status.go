package runner

import (
	"fmt"
	"time"
)

// pauseReason says why claiming is paused now; "" is not paused.
type pauseReason string

const (
	pauseNone           pauseReason = ""
	pauseLaunchFailures pauseReason = "launch_failures"    // R37's backoff after launches failed in a row
	pauseHostRefused    pauseReason = "host_token_refused" // the control plane refused the host token
	pauseHostTokenInUse pauseReason = "host_token_in_use"  // another live daemon uses the host token (instance.go)
	pauseSandbox        pauseReason = WithheldSandbox      // the sandbox backend does not answer (probe.go)
)

// pauseReasons are the reasons runnerd_claims_paused reports, in order.
var pauseReasons = []pauseReason{pauseLaunchFailures, pauseHostRefused, pauseHostTokenInUse, pauseSandbox}

// status is what the daemon is doing, as metrics and systemd's STATUS=
// line tell it.
type status struct {
	capacity int
	busy     int // slots taken: running attempts plus a claim in flight
	running  int // attempts held
	draining bool
	paused   pauseReason
}

func (d *Daemon) status(now time.Time) status {
	d.mu.Lock()
	s := status{capacity: d.cfg.Capacity, busy: d.busy, running: d.busy - d.claiming}
	refused, inUse, backend := d.hostRefused, d.inUse, d.backend
	d.mu.Unlock()
	s.draining = d.draining()
	switch {
	case refused:
		s.paused = pauseHostRefused
	case inUse:
		s.paused = pauseHostTokenInUse
	case backend == backendUnavailable:
		s.paused = pauseSandbox
	case d.gate.pause(now) > 0:
		s.paused = pauseLaunchFailures
	}
	return s
}

// String is the STATUS= line: "running 3/4 turns", "draining 2 turns",
// "claims paused: launch failures (1/4 turns)".
func (s status) String() string {
	switch {
	case s.paused == pauseHostRefused: // it drains too, but this is why
		return fmt.Sprintf("claims stopped: host token refused (%d/%d turns)", s.running, s.capacity)
	case s.paused == pauseHostTokenInUse:
		return fmt.Sprintf("claims paused: host token in use by another daemon (%d/%d turns)", s.running, s.capacity)
	case s.draining:
		return fmt.Sprintf("draining %d turns", s.running)
	case s.paused == pauseLaunchFailures:
		return fmt.Sprintf("claims paused: launch failures (%d/%d turns)", s.running, s.capacity)
	case s.paused == pauseSandbox:
		return fmt.Sprintf("claims withheld: sandbox unavailable (%d/%d turns)", s.running, s.capacity)
	}
	return fmt.Sprintf("running %d/%d turns", s.running, s.capacity)
}

// notifyStatus sends systemd a STATUS= line when it changed. Before the
// first acknowledged host heartbeat (ready false) with nothing else to
// say, the line says what the daemon waits for. Only the host heartbeat
// loop calls it.
func (d *Daemon) notifyStatus(ready bool) {
	s := d.status(time.Now())
	line := s.String()
	if !ready && s.paused == pauseNone && !s.draining {
		line = "starting: waiting for the control plane"
	}
	if line == d.lastStatus {
		return
	}
	d.lastStatus = line
	d.notify("STATUS=" + line)
}
