package runner

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/heartbeat"
	"github.com/runnerd/runnerd/settlement"
	"github.com/runnerd/runnerd/wire"
)

// newReporter is the attempt's Reporter: its terminal report under the
// report policy (K1) and its fence.
func (d *Daemon) newReporter(c wire.Claim) *settlement.Reporter {
	return settlement.NewReporter(settlement.ReporterConfig{
		BaseURL:     d.control.BaseURL,
		Transport:   d.cfg.Transport, // through the endpoints (New)
		WorkerToken: c.WorkerToken,
		JobID:       c.JobID,
		Attempt:     wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration},
		Logger:      d.log,
		Reports:     d.cfg.Reports,
	})
}

// finish persists the attempt's terminal report, then sends it through the
// attempt's Reporter while renewal goes on, until it is acknowledged or
// definitively refused (K1). Only then is the attempt forgotten and its
// renewal stopped (P2: a restart before that re-sends the same report):
//
//	acknowledged            forgotten
//	lease rejected          forgotten (409/410/401/403/404: nothing more is ours)
//	lease expired locally   kept for the next start, which asks the control plane
//	refused (400)           kept, runnerd_report_refused: our bug, for a person
//	handover (runCtx ended) kept for the next start
//
// outcome labels the turns metric.
func (d *Daemon) finish(runCtx context.Context, a *attempt, rep settlement.Report, outcome string) {
	if err := d.state.save(record{Claim: a.claim, ClaimedAt: a.claimedAt, Report: &rep}); err != nil {
		// The report can still be sent; only a restart before the answer
		// would lose it, and then the reaper decides (R21).
		d.logErrClass(slog.LevelError, MsgPersistFailed, a.id, "persist_report", err)
	}
	if runCtx.Err() != nil {
		d.logAttempt(slog.LevelWarn, MsgReportAbandoned, a.id, slog.String(keyOutcome, outcome), slog.String(keyDecision, "kept_for_restart"))
		return
	}
	resp, err := a.reporter.Send(runCtx, rep)
	switch {
	case err == nil:
		if rep.Release != nil && resp.JobState == wire.JobQueued {
			d.logAttempt(slog.LevelInfo, MsgTurnReleased, a.id, slog.String(diagnostics.KeyClass, rep.Release.Class))
		} else if rep.Release != nil {
			outcome = wire.OutcomeFailed // refused as admitted: failed instead (R36)
		}
		d.m.turnEnded(outcome, a.claimedAt)
		d.logAttempt(slog.LevelInfo, MsgReportSent, a.id, slog.String(keyOutcome, outcome),
			slog.String(keyJobState, resp.JobState), slog.String(keyConvState, resp.ConversationState))
		if resp.ConversationState == wire.ConversationLost {
			d.removeSandbox(a.claim.Turn.ConversationID)
		}
		d.forget(a, "")
	case runCtx.Err() != nil:
		d.logAttempt(slog.LevelWarn, MsgReportAbandoned, a.id, slog.String(keyOutcome, outcome), slog.String(keyDecision, "kept_for_restart"))
	case errors.Is(err, settlement.ErrLeaseRejected) && expiredLocally(a.renewer):
		// No answer for a whole lease is no verdict: the next start asks
		// the control plane whether the lease is still ours (P4).
		d.m.turnEnded("lease_lost", a.claimedAt)
		d.logAttempt(slog.LevelWarn, MsgReportAbandoned, a.id, slog.String(keyOutcome, outcome), slog.String(keyDecision, "kept_for_restart"))
	case errors.Is(err, settlement.ErrLeaseRejected):
		d.forget(a, "lease_lost")
	default:
		// A refusal no retry changes (a 400): a bug of ours. Say so loudly
		// and keep the report for a person; the reaper decides the job.
		d.m.turnEnded("refused", a.claimedAt)
		d.logErrClass(slog.LevelError, MsgReportRefused, a.id, rep.Op(), err)
	}
}

// expiredLocally: the renewer ended because its last acknowledgement is a
// whole lease old (R10), not on an answer.
func expiredLocally(r *heartbeat.Renewer) bool {
	select {
	case <-r.Done():
		return r.Verdict().Outcome == heartbeat.Expired
	default:
		return false
	}
}

// forget removes the attempt's state file: the attempt is settled, released
// or no longer ours. why labels the turns metric when nothing was reported.
func (d *Daemon) forget(a *attempt, why string) {
	if why != "" {
		d.m.turnEnded(why, a.claimedAt)
	}
	if err := d.state.remove(a.claim.AttemptID); err != nil {
		d.logErrClass(slog.LevelError, MsgPersistFailed, a.id, "forget", err)
	}
	a.renewer.Stop()
}

// removeSandbox removes a LOST conversation's retained sandbox: nothing
// will ever run in it again (R30, R32).
func (d *Daemon) removeSandbox(conversationID string) {
	if d.cfg.Backend == nil || conversationID == "" {
		d.log.LogAttrs(context.Background(), slog.LevelInfo, MsgSandboxKept,
			slog.String(keyConversation, conversationID), slog.String(keyDecision, "no_backend"))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), d.teardownBound())
	defer cancel()
	began := time.Now()
	err := d.cfg.Backend.Remove(ctx, conversationID)
	if d.teardownEnded(teardownDelete, conversationID, began, err) {
		return // removed, but not proven: the record names what survived
	}
	if err != nil {
		d.log.LogAttrs(context.Background(), slog.LevelWarn, MsgSandboxKept,
			slog.String(keyConversation, conversationID), slog.String(diagnostics.KeyClass, diagnostics.Class(err)))
		return
	}
	d.log.LogAttrs(context.Background(), slog.LevelInfo, MsgSandboxRemoved, slog.String(keyConversation, conversationID))
}
