package runner

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/wire"
)

// sandboxStopper is what idle eviction needs of a backend: list this
// host's sandboxes and stop one without deleting it. sandbox/process and
// sandbox/docker implement it.
type sandboxStopper interface {
	Conversations(ctx context.Context) ([]string, error)
	sandbox.Stopper
}

// sandboxPhase is what the daemon knows of a retained sandbox that no turn
// holds. A held conversation (turnConvs) has no idle entry: it is never
// evicted.
type sandboxPhase int

const (
	// sandboxRetained: running, or not known to be stopped; idle since the
	// last turn held here ended, or since this daemon first listed it.
	sandboxRetained sandboxPhase = iota
	// sandboxStopped: evicted (or found stopped) since; the next turn's
	// Ensure wakes it.
	sandboxStopped
	// sandboxKept: not to be stopped until its next turn ends — its ACP
	// agent's session could not be loaded into a new process, so a stop
	// would lose the conversation (A6).
	sandboxKept
)

// sandboxIdle is one conversation's idle clock, guarded by Daemon.mu.
type sandboxIdle struct {
	phase sandboxPhase
	since time.Time // retained: idle since; stopped: stopped since
}

// idleLoop stops the retained sandboxes whose conversation had no turn on
// this host for Config.SandboxIdle (S1): stopped, not deleted; the
// conversation stays usable and the next turn's Ensure starts its sandbox
// again, through the same verification as after a supervisor restart
// (K13: exact sandbox, native turn boundary, session resumed or
// unrecoverable with evidence). A sandbox whose live ACP agent cannot load
// its session into a new process is kept running instead: stopping it would
// make its conversation unrecoverable. It starts after the restart decisions, so
// every re-attached turn is already held. Idle time is counted on this
// daemon's monotonic clock from the end of the last turn it held, or from
// when it first listed the sandbox (a restart starts the clock again: an
// eviction can come late, never early).
//
// Nothing running is evicted. A claim holds its conversation
// (holdConversation) before its turn child exists, and the child reaches
// the sandbox only through the backend's Ensure, which takes the
// conversation's lock; Stop asks idle under that same lock, and idle
// answers from turnConvs under d.mu. So either the claim's hold came first
// (idle says no) or the child's Ensure waits until the sandbox is stopped
// and then starts it (the wake). A supervisor that says it runs a turn
// (an earlier run's child not re-attached) is not stopped either.
func (d *Daemon) idleLoop(ctx context.Context, st sandboxStopper) {
	period := min(d.cfg.SandboxIdle/4, time.Minute)
	for {
		d.idleRound(ctx, st)
		if !sleep(ctx.Done(), jitter(period, d.cfg.Jitter)) {
			return
		}
	}
}

// idleRound lists the sandboxes, starts the clocks of the new ones, drops
// those of the ones gone and stops those idle long enough.
func (d *Daemon) idleRound(ctx context.Context, st sandboxStopper) {
	for _, c := range d.noteSandboxes(ctx, st) {
		if ctx.Err() != nil {
			return
		}
		d.evict(ctx, st, c, d.cfg.SandboxIdle, evictIdle)
	}
}

// noteSandboxes lists the sandboxes, starts the clocks of the new ones and
// drops those of the ones gone; it returns those idle for SandboxIdle.
func (d *Daemon) noteSandboxes(ctx context.Context, st sandboxStopper) (due []string) {
	lctx, cancel := context.WithTimeout(ctx, d.cfg.ControlTimeout)
	convs, err := st.Conversations(lctx)
	cancel()
	if err != nil {
		return nil // the sweep records listing failures; the next round tries again
	}
	now := time.Now()
	listed := make(map[string]bool, len(convs))
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range convs {
		listed[c] = true
		s, ok := d.idle[c]
		switch {
		case d.turnConvs[c] > 0:
		case !ok:
			d.idle[c] = &sandboxIdle{phase: sandboxRetained, since: now}
		case s.phase == sandboxRetained && d.cfg.SandboxIdle > 0 && now.Sub(s.since) >= d.cfg.SandboxIdle:
			due = append(due, c)
		}
	}
	for c := range d.idle {
		if !listed[c] {
			delete(d.idle, c) // removed (the sweep, a LOST turn): nothing to evict
		}
	}
	return due
}

// Why a sandbox is evicted: its records' cause.
const (
	evictIdle     = "idle"     // --sandbox-idle without a turn (S1)
	evictPressure = "pressure" // the host is short of disk or memory (S2)
)

// evict stops one conversation's sandbox if, asked under the backend's
// lock, it is still idle — no turn held, idle at least minIdle — with one
// record either way.
func (d *Daemon) evict(ctx context.Context, st sandboxStopper, conv string, minIdle time.Duration, cause string) {
	var idleFor time.Duration
	asked, committed := false, false
	idle := func() bool {
		asked = true
		d.mu.Lock()
		defer d.mu.Unlock()
		s := d.idle[conv]
		if d.turnConvs[conv] > 0 || s == nil || s.phase != sandboxRetained {
			return false
		}
		now := time.Now()
		if idleFor = now.Sub(s.since); idleFor < minIdle {
			return false
		}
		// Stopped from here on as far as a claim is concerned: its
		// child's Ensure waits for the lock Stop holds, then wakes it.
		s.phase, s.since, committed = sandboxStopped, now, true
		return true
	}
	sctx, cancel := context.WithTimeout(ctx, d.teardownBound())
	began := time.Now()
	stopped, err := st.Stop(sctx, conv, idle)
	cancel()
	attrs := []slog.Attr{slog.String(keyConversation, conv), slog.String(keyBackend, d.cfg.Backend.Name()),
		slog.String(diagnostics.KeyCause, cause)}
	switch {
	case stopped:
		// Stopped; a survivor of the stop is named (S6), and the
		// sandbox counts as stopped all the same: its supervisor is.
		d.teardownEnded(cause, conv, began, err)
		d.m.SandboxEvictions.WithLabelValues("evicted").Inc()
		d.kickSweepNow() // the control plane learns of the stop (sandbox_state)
		d.log.LogAttrs(context.Background(), slog.LevelInfo, diagnostics.MsgSandboxEvicted,
			append(attrs, slog.Int64(diagnostics.KeyIdle, idleFor.Milliseconds()))...)
		return
	case err == nil && !asked:
		// Nothing of it runs (stopped before this daemon started, or its
		// supervisor died): nothing to stop until a turn starts it again.
		d.mu.Lock()
		if s := d.idle[conv]; s != nil && s.phase == sandboxRetained && d.turnConvs[conv] == 0 {
			s.phase, s.since = sandboxStopped, time.Now()
		}
		d.mu.Unlock()
		return
	}
	unloadable := errors.Is(err, sandbox.ErrSessionNotLoadable)
	if committed {
		// Not stopped after all (busy, unloadable, or the backend failed):
		// still running; idle as before, or kept until its next turn.
		d.mu.Lock()
		if s := d.idle[conv]; s != nil && s.phase == sandboxStopped {
			s.phase, s.since = sandboxRetained, time.Now().Add(-idleFor)
			if unloadable {
				s.phase = sandboxKept
			}
		}
		d.mu.Unlock()
	}
	if err != nil && ctx.Err() == nil {
		class := diagnostics.Class(err)
		switch {
		case errors.Is(err, sandbox.ErrBusy):
			class = "busy"
		case unloadable:
			class = "session_not_loadable" // once per idle period: kept until a turn ends
		}
		d.m.SandboxEvictions.WithLabelValues(class).Inc()
		d.log.LogAttrs(context.Background(), slog.LevelWarn, diagnostics.MsgSandboxEvictFailed,
			append(attrs, slog.String(diagnostics.KeyClass, class))...)
	}
}

// sandboxStates is what the sweep reports of convs' sandboxes (S1):
// stopped, or running — not known to be stopped: retained or kept — for
// those this daemon keeps a clock of; nil when it keeps none (idle
// eviction and pressure off).
func (d *Daemon) sandboxStates(convs []string) map[string]string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.idle == nil {
		return nil
	}
	out := map[string]string{}
	for _, c := range convs {
		s, ok := d.idle[c]
		switch {
		case !ok || d.turnConvs[c] > 0:
		case s.phase == sandboxStopped:
			out[c] = wire.SandboxStopped
		default:
			out[c] = wire.SandboxRunning
		}
	}
	return out
}

// wakeNotedLocked is called by holdConversation under d.mu: the conversation's
// turn is held here now, so its idle clock goes; if its sandbox was
// stopped, the turn's Ensure wakes it, and that is recorded.
func (d *Daemon) wakeNotedLocked(conv string) (stoppedFor time.Duration, woken bool) {
	s, ok := d.idle[conv]
	if !ok {
		return 0, false
	}
	delete(d.idle, conv)
	if s.phase != sandboxStopped {
		return 0, false
	}
	return time.Since(s.since), true
}
