package runner

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/settlement"
	"github.com/runnerd/runnerd/wire"
)

// sendBackoffMax caps the wait between rounds of a report that the
// control plane keeps failing while the lease is still renewed.
const sendBackoffMax = time.Minute

// finish persists the attempt's terminal report, sends it, forgets the
// attempt and stops renewal, in this order (P2: a restart in between
// re-sends the same report). After a hard stop the report stays persisted
// for the next start. outcome labels the turns metric.
func (d *Daemon) finish(runCtx context.Context, a *attempt, rep report, outcome string) {
	if err := d.state.save(record{Claim: a.claim, ClaimedAt: a.claimedAt, Report: &rep}); err != nil {
		// The report can still be sent; only a restart before the answer
		// would lose it, and then the reaper decides (R21).
		d.logErrClass(slog.LevelError, MsgPersistFailed, a.id, "persist_report", err)
	}
	if a.stopReason() == stopHard || runCtx.Err() != nil {
		d.logAttempt(slog.LevelWarn, MsgReportAbandoned, a.id, slog.String(keyOutcome, outcome), slog.String(keyDecision, "kept_for_restart"))
		return
	}
	// Until the lease is lost or the daemon stops hard, a report is owed:
	// rounds of the receipt policy, further apart each time (R21).
	ctx, cancel := context.WithCancel(runCtx)
	defer cancel()
	defer context.AfterFunc(a.fenced, cancel)()
	wait := d.cfg.Timings.RetryDelay
	for {
		resp, err := d.send(ctx, a, rep)
		switch {
		case err == nil:
			d.m.Turns.WithLabelValues(outcome).Inc()
			d.logAttempt(slog.LevelInfo, MsgReportSent, a.id, slog.String(keyOutcome, outcome),
				slog.String(keyJobState, resp.JobState), slog.String(keyConvState, resp.ConversationState))
			if resp.ConversationState == wire.ConversationLost {
				d.removeSandbox(a.claim.Turn.ConversationID)
			}
			d.forget(a, "")
			return
		case a.stopReason() == stopLease || errors.Is(err, settlement.ErrLeaseRejected) || settlement.RejectsLease(err):
			d.forget(a, "lease_lost")
			return
		case runCtx.Err() != nil:
			d.logAttempt(slog.LevelWarn, MsgReportAbandoned, a.id, slog.String(keyOutcome, outcome), slog.String(keyDecision, "kept_for_restart"))
			return
		case wire.Classify(err) != wire.Transient:
			// A refusal no retry changes (400, a 409 that is not about the
			// lease): the control plane's reaper decides.
			d.logErrClass(slog.LevelError, MsgReportAbandoned, a.id, opOf(rep), err)
			d.forget(a, "refused")
			return
		}
		if !sleep(ctx.Done(), jitter(wait, d.cfg.Jitter)) {
			continue // the loop's next send sees why
		}
		wait = min(wait*2, sendBackoffMax)
	}
}

// send sends one report under the receipt policy (R24) through a
// settlement.Session, which fences every write once the lease is lost:
// release, finish or abandon.
func (d *Daemon) send(ctx context.Context, a *attempt, rep report) (wire.FinishResponse, error) {
	s, err := settlement.New(settlement.Config{
		BaseURL:     d.cfg.ControlPlaneURL,
		Transport:   d.cfg.Transport,
		WorkerToken: a.claim.WorkerToken,
		JobID:       a.claim.JobID,
		Attempt:     a.ref,
		Logger:      d.log,
		Policy:      d.cfg.Receipts,
	})
	if err != nil {
		return wire.FinishResponse{}, err
	}
	defer s.Close()
	a.mu.Lock()
	a.session = s
	lost := a.reason == stopLease
	a.mu.Unlock()
	if lost {
		s.LeaseLost()
	}
	defer func() {
		a.mu.Lock()
		a.session = nil
		a.mu.Unlock()
	}()
	if rep.Release != nil {
		err := s.Release(ctx, rep.Release.Class)
		if err == nil {
			d.logAttempt(slog.LevelInfo, MsgTurnReleased, a.id, slog.String(diagnostics.KeyClass, rep.Release.Class))
			return wire.FinishResponse{JobState: wire.JobQueued}, nil
		}
		if !isAdmittedRefusal(err) {
			return wire.FinishResponse{}, err
		}
		// The control plane says the job was admitted: the child did
		// accept after all. Never requeue it (R36); fail it instead.
		f := settlement.Facts{Admitted: true}.Report(a.ref, settlement.Result{Outcome: wire.OutcomeFailed, Class: ClassReleaseRefused})
		rep = fromSettlement(f)
	}
	return s.Send(ctx, settlement.Report{Finish: rep.Finish, Abandon: rep.Abandon})
}

func isAdmittedRefusal(err error) bool {
	var se *wire.StatusError
	return errors.As(err, &se) && se.Code == wire.CodeAdmitted
}

func opOf(r report) string {
	switch {
	case r.Release != nil:
		return wire.OpRelease
	case r.Abandon != nil:
		return wire.OpAbandon
	}
	return wire.OpFinish
}

// forget removes the attempt's state file: the attempt is settled, released
// or no longer ours. why labels the turns metric when nothing was reported.
func (d *Daemon) forget(a *attempt, why string) {
	if why != "" {
		d.m.Turns.WithLabelValues(why).Inc()
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
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.ControlTimeout+d.cfg.StopGrace)
	defer cancel()
	if err := d.cfg.Backend.Remove(ctx, conversationID); err != nil {
		d.log.LogAttrs(context.Background(), slog.LevelWarn, MsgSandboxKept,
			slog.String(keyConversation, conversationID), slog.String(diagnostics.KeyClass, diagnostics.Class(err)))
		return
	}
	d.log.LogAttrs(context.Background(), slog.LevelInfo, MsgSandboxRemoved, slog.String(keyConversation, conversationID))
}
