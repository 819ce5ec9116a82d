package runner

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/sandbox"
)

// teardownDelete is the teardown of a deletion (a LOST or deleted
// conversation's sandbox removed); evictIdle and evictPressure name the
// evictions'. Each is a value of the teardown label (S6).
const teardownDelete = "delete"

// teardownBound bounds a sandbox's stop or removal: the control request
// its backend may make, and the longer of the stop grace and the teardown
// budget its proof may wait.
func (d *Daemon) teardownBound() time.Duration {
	return d.cfg.ControlTimeout + max(d.cfg.StopGrace, d.cfg.TeardownBudget)
}

// teardownEnded is called once a backend's Stop or Remove of conv's
// sandbox, begun at began, returned err: a teardown was made if err is nil
// or a *sandbox.TeardownIncomplete (any other error made none, and is the
// caller's to record). It times the teardown and, when it did not prove the
// sandbox's processes gone within the budget, counts it and writes the
// record naming what survived (S6). It reports whether it wrote one.
func (d *Daemon) teardownEnded(which, conv string, began time.Time, err error) (incomplete bool) {
	var ti *sandbox.TeardownIncomplete
	if err != nil && !errors.As(err, &ti) {
		return false
	}
	d.m.SandboxTeardown.WithLabelValues(which).Observe(time.Since(began).Seconds())
	if ti == nil {
		return false
	}
	d.m.SandboxTeardownIncomplete.WithLabelValues(which).Inc()
	attrs := []slog.Attr{slog.String(keyConversation, conv), slog.String(keyBackend, d.cfg.Backend.Name()),
		slog.String(diagnostics.KeyTeardown, which), slog.Int64(diagnostics.KeyBudget, ti.Budget.Milliseconds())}
	if len(ti.PIDs) > 0 {
		attrs = append(attrs, slog.Any(diagnostics.KeyPIDs, ti.PIDs))
	}
	if ti.Container != "" {
		attrs = append(attrs, slog.String(diagnostics.KeyContainer, ti.Container))
	}
	if ti.Err != nil {
		attrs = append(attrs, slog.String(diagnostics.KeyClass, diagnostics.Class(ti.Err)))
	}
	d.log.LogAttrs(context.Background(), slog.LevelError, diagnostics.MsgSandboxTeardownIncomplete, attrs...)
	return true
}

// teardownCollector is a backend whose supervisors leave a record of each
// teardown of a turn's agent tree they could not prove (a cancel, a
// fence: sandbox.TeardownRecordsDir). sandbox/process and sandbox/docker
// implement it.
type teardownCollector interface {
	CollectTeardownRecords(ctx context.Context, conversationID string) ([]sandbox.TeardownRecord, error)
}

// collectTeardowns takes the supervisors' records of teardowns they could
// not prove for each listed sandbox, and counts each in
// runnerd_sandbox_teardown_incomplete_total by its teardown, with one
// daemon record (source supervisor) naming what survived (S6). The sweep
// calls it every round; a sandbox whose records cannot be read now is
// tried again the next.
func (d *Daemon) collectTeardowns(ctx context.Context, listed []sandbox.Listed) {
	c, ok := d.cfg.Backend.(teardownCollector)
	if !ok {
		return
	}
	for _, l := range listed {
		if ctx.Err() != nil {
			return
		}
		recs, _ := c.CollectTeardownRecords(ctx, l.ConversationID)
		for _, r := range recs {
			d.m.SandboxTeardownIncomplete.WithLabelValues(r.Teardown).Inc()
			attrs := []slog.Attr{slog.String(keyConversation, l.ConversationID), slog.String(keyBackend, d.cfg.Backend.Name()),
				slog.String(diagnostics.KeyTeardown, r.Teardown), slog.Int64(diagnostics.KeyBudget, r.BudgetMS),
				slog.String(keySource, sourceSupervisor)}
			if len(r.PIDs) > 0 {
				attrs = append(attrs, slog.Any(diagnostics.KeyPIDs, r.PIDs))
			}
			d.log.LogAttrs(context.Background(), slog.LevelError, diagnostics.MsgSandboxTeardownIncomplete, attrs...)
		}
	}
}

// sourceSupervisor is the source of a teardown record the supervisor left
// (collectTeardowns); the daemon's own teardowns' records carry none.
const sourceSupervisor = "supervisor"
