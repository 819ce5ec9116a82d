package runner

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// probe serves p through ProbeHandler as /healthz and /readyz do.
func probe(t *testing.T, p func(time.Time) Probe) (int, Probe) {
	t.Helper()
	w := httptest.NewRecorder()
	ProbeHandler(p).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	var got Probe
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatalf("probe body %q: %v", w.Body, err)
	}
	return w.Code, got
}

func check(p Probe, name string) ProbeCheck {
	for _, c := range p.Checks {
		if c.Name == name {
			return c
		}
	}
	return ProbeCheck{Name: name + " (absent)"}
}

// /healthz is 200 while the claim loop and the host heartbeat keep their
// check-in promises, 503 naming the loop and how late once one is past
// it; /readyz is 200 once a host heartbeat was acknowledged and claiming
// is enabled, 503 naming the reason when the daemon drains.
func TestProbesHealthAndReadiness(t *testing.T) {
	c := newCP(t)
	r := startDaemon(t, c, nil)
	waitFor(t, "ready", 15*time.Second, func() bool { return r.d.Readiness(time.Now()).OK })
	code, p := probe(t, r.d.Readiness)
	if code != http.StatusOK || !p.OK || !check(p, "control_plane").OK || !check(p, "claiming").OK {
		t.Fatalf("readyz %d %+v", code, p)
	}
	code, p = probe(t, r.d.Liveness)
	if code != http.StatusOK || !check(p, "claim_loop").OK || !check(p, "host_heartbeat_loop").OK {
		t.Fatalf("healthz %d %+v", code, p)
	}

	// An hour on, no loop has checked in as it promised: both are named.
	code, p = probe(t, func(now time.Time) Probe { return r.d.Liveness(now.Add(time.Hour)) })
	if code != http.StatusServiceUnavailable || p.OK {
		t.Fatalf("healthz an hour on: %d %+v", code, p)
	}
	for _, name := range []string{"claim_loop", "host_heartbeat_loop"} {
		if ch := check(p, name); ch.OK || ch.Reason != ReasonLoopStuck || ch.OverdueMS < (50*time.Minute).Milliseconds() {
			t.Errorf("%s an hour on: %+v", name, ch)
		}
	}

	r.d.Drain()
	code, p = probe(t, r.d.Readiness)
	if ch := check(p, "claiming"); code != http.StatusServiceUnavailable || ch.OK || ch.Reason != ReasonDraining {
		t.Fatalf("readyz while draining: %d %+v", code, p)
	}
}

// A control plane that does not answer makes the daemon unready, the
// reason carrying the heartbeat's class; the daemon stays live — an
// outage is not a hang.
func TestProbesUnreachableControlPlane(t *testing.T) {
	c := newCP(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := "http://" + l.Addr().String()
	l.Close()
	r := startDaemon(t, c, func(cfg *Config) { cfg.ControlPlaneURL = gone })
	want := ReasonHeartbeatFailed + ":connection_refused"
	waitFor(t, "unready for the refused heartbeat", 15*time.Second, func() bool {
		return check(r.d.Readiness(time.Now()), "control_plane").Reason == want
	})
	code, p := probe(t, r.d.Readiness)
	if code != http.StatusServiceUnavailable || p.OK || !strings.Contains(check(p, "control_plane").Reason, "connection_refused") {
		t.Fatalf("readyz: %d %+v", code, p)
	}
	if code, p := probe(t, r.d.Liveness); code != http.StatusOK {
		t.Fatalf("healthz during an outage: %d %+v", code, p)
	}
}
