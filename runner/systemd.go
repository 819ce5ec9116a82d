package runner

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/runnerd/runnerd/diagnostics"
)

// Notifier is the daemon's view of the service manager (systemd's
// sd_notify). cmd gives it a real one when NOTIFY_SOCKET is set; nil
// means none.
type Notifier interface {
	Notify(state string) error
}

// Scopes is the daemon's view of where its turn children live (systemd's
// transient scopes, internal/sdscope, given by cmd).
type Scopes interface {
	// Place moves the process pid, which has started nothing yet, into a
	// new unit of its own named unit; an error leaves it where it is.
	Place(ctx context.Context, pid int, unit string) error
	// Unit names the unit of one attempt.
	Unit(jobID, attemptID string) string
	// Class is an error of Place's as a record class.
	Class(err error) string
}

// Mechanisms the start record names.
const (
	scopesSystemd = "systemd_scope" // each turn child in a transient scope of its own
	scopesNone    = "none"          // children stay in the daemon's cgroup: a stop of the service ends them
)

// logScopes is the start record of where turn children live.
func (d *Daemon) logScopes() {
	attrs := []slog.Attr{slog.String(keyMechanism, scopesSystemd)}
	if d.cfg.Scopes == nil {
		why := d.cfg.ScopesOff
		if why == "" {
			why = "not_configured"
		}
		attrs = []slog.Attr{slog.String(keyMechanism, scopesNone), slog.String(keyReason, why)}
	}
	if d.cfg.CgroupHierarchy != "" {
		attrs = append(attrs, slog.String(keyCgroup, d.cfg.CgroupHierarchy))
	}
	d.log.LogAttrs(context.Background(), slog.LevelInfo, MsgTurnScopes, attrs...)
}

// placeTurn is handover's Started hook: it moves a's new child into the
// attempt's scope. A failure is recorded and the turn goes on where it is:
// it runs as it did before scopes, and a stop of the service ends it.
func (d *Daemon) placeTurn(a *attempt) func(pid int) {
	if d.cfg.Scopes == nil {
		return nil
	}
	return func(pid int) {
		unit := d.cfg.Scopes.Unit(a.id.JobID, a.id.AttemptID)
		if err := d.cfg.Scopes.Place(context.Background(), pid, unit); err != nil {
			d.logAttempt(slog.LevelWarn, MsgTurnScopeFailed, a.id, slog.String(diagnostics.KeyClass, d.cfg.Scopes.Class(err)))
			return
		}
		a.scope = unit
	}
}

// sd_notify states the daemon sends.
const (
	notifyReady    = "READY=1"    // after the first acknowledged host heartbeat
	notifyWatchdog = "WATCHDOG=1" // while the claim and heartbeat loops are live
	notifyStopping = "STOPPING=1" // when a drain or a stop begins
)

// Loops the watchdog watches.
const (
	loopClaim = iota
	loopBeat
	numLoops
)

var loopNames = [numLoops]string{"claim", "host_heartbeat"}

// healthSlack is added to every promise a loop makes: scheduling noise is
// not a hang.
const healthSlack = 5 * time.Second

// health is what the watchdog pets on (style 15: only on real health).
// Each loop promises, before every wait, when it will check in again; a
// loop past its promise is stuck. A loop that waits on a dead control plane
// keeps its promises — an outage is not a hang, and a restart would only
// kill the turns.
type health struct {
	mu    sync.Mutex
	until [numLoops]time.Time
}

func newHealth() *health {
	h := &health{}
	now := time.Now()
	for i := range h.until {
		h.until[i] = now.Add(time.Minute)
	}
	return h
}

// expect is loop's promise to check in again within d.
func (h *health) expect(loop int, d time.Duration) {
	h.mu.Lock()
	h.until[loop] = time.Now().Add(d)
	h.mu.Unlock()
}

// done marks loop as ended on purpose (the claim loop after a drain):
// it is never stuck from now on.
func (h *health) done(loop int) {
	h.mu.Lock()
	h.until[loop] = time.Unix(1<<62, 0)
	h.mu.Unlock()
}

// overdue is how far past its promise each loop is at now (zero or less:
// within it).
func (h *health) overdue(now time.Time) [numLoops]time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	var o [numLoops]time.Duration
	for i, u := range h.until {
		o[i] = now.Sub(u)
	}
	return o
}

// stuck returns the first loop past its promise at now, or -1.
func (h *health) stuck(now time.Time) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, u := range h.until {
		if now.After(u) {
			return i
		}
	}
	return -1
}

// watchdogLoop sends WATCHDOG=1 every WatchdogInterval while no loop is
// stuck; one record when that stops, none while it stays so.
func (d *Daemon) watchdogLoop(ctx context.Context) {
	t := time.NewTicker(d.cfg.WatchdogInterval)
	defer t.Stop()
	reported := false
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if l := d.health.stuck(now); l >= 0 {
				if !reported {
					reported = true
					d.log.LogAttrs(context.Background(), slog.LevelError, MsgWatchdogUnhealthy, slog.String(keyLoop, loopNames[l]))
				}
				continue
			}
			reported = false
			d.notify(notifyWatchdog)
		}
	}
}
