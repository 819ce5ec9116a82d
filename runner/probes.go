package runner

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/runnerd/runnerd/diagnostics"
)

// Probe is the body of /healthz and /readyz: ok, and each check with the
// reason of one that fails.
type Probe struct {
	OK     bool         `json:"ok"`
	Checks []ProbeCheck `json:"checks"`
}

// ProbeCheck is one check of a Probe.
type ProbeCheck struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Reason string `json:"reason,omitempty"`
	// OverdueMS is how long a loop is past its promise to check in (healthz).
	OverdueMS int64 `json:"overdue_ms,omitempty"`
}

// Reasons of a failing readiness check.
const (
	ReasonNoHeartbeatYet  = "no_host_heartbeat_answered_yet"
	ReasonHeartbeatFailed = "last_host_heartbeat_failed" // with its class: last_host_heartbeat_failed:tls_expired
	ReasonDraining        = "draining"
	ReasonLoopStuck       = "missed_its_check_in"
)

// beatState is the outcome of the last host heartbeat, for /readyz.
type beatState struct {
	at    time.Time // zero: none sent yet
	class string    // "" when it was acknowledged; else its error class
}

// noteBeat keeps the outcome of a host heartbeat sent at now.
func (d *Daemon) noteBeat(now time.Time, err error) {
	d.mu.Lock()
	d.beat = beatState{at: now, class: diagnostics.Class(err)}
	d.mu.Unlock()
}

// Liveness is /healthz: the process answers, and each loop the watchdog
// watches (the claim loop, the host heartbeat) checked in within the bound
// it promised before its last wait — a long poll, a backoff, an idle
// check — plus healthSlack. A loop waiting on a dead control plane keeps
// its promises: an outage is not a hang (readiness says it).
func (d *Daemon) Liveness(now time.Time) Probe {
	p := Probe{OK: true}
	for i, over := range d.health.overdue(now) {
		c := ProbeCheck{Name: loopNames[i] + "_loop", OK: over <= 0}
		if !c.OK {
			c.Reason, c.OverdueMS, p.OK = ReasonLoopStuck, over.Milliseconds(), false
		}
		p.Checks = append(p.Checks, c)
	}
	return p
}

// Readiness is /readyz: the control plane acknowledged the last host
// heartbeat, and claiming is enabled — no drain, no pause (launch
// failures, a refused host token, an unavailable sandbox backend).
func (d *Daemon) Readiness(now time.Time) Probe {
	d.mu.Lock()
	beat := d.beat
	d.mu.Unlock()
	cp := ProbeCheck{Name: "control_plane", OK: !beat.at.IsZero() && beat.class == ""}
	switch {
	case beat.at.IsZero():
		cp.Reason = ReasonNoHeartbeatYet
	case beat.class != "":
		cp.Reason = ReasonHeartbeatFailed + ":" + beat.class
	}
	s := d.status(now)
	claiming := ProbeCheck{Name: "claiming", OK: !s.draining && s.paused == pauseNone}
	switch {
	case s.paused != pauseNone:
		claiming.Reason = "paused:" + string(s.paused)
	case s.draining:
		claiming.Reason = ReasonDraining
	}
	return Probe{OK: cp.OK && claiming.OK, Checks: []ProbeCheck{cp, claiming}}
}

// ProbeHandler serves probe as JSON: 200 when it is ok, 503 when not.
func ProbeHandler(probe func(time.Time) Probe) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := probe(time.Now())
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if !p.OK {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(p)
	})
}
