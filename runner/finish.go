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
		case a.stopReason() == stopLease || errors.Is(err, settlement.ErrLeaseRejected) || rejectsLease(err):
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

// send sends one report under the receipt policy: finish and abandon
// through a settlement.Session (which fences on lease loss), a release with
// the same policy here.
func (d *Daemon) send(ctx context.Context, a *attempt, rep report) (wire.FinishResponse, error) {
	if rep.Release != nil {
		err := d.release(ctx, a.id, a.claim.WorkerToken, *rep.Release)
		if err != nil && isAdmittedRefusal(err) {
			// The control plane says the job was admitted: the child did
			// accept after all. Never requeue it (R36); fail it instead.
			f := settlement.Facts{Admitted: true}.Report(a.ref, settlement.Result{Outcome: wire.OutcomeFailed, Class: ClassReleaseRefused})
			rep = fromSettlement(f)
		} else {
			return wire.FinishResponse{JobState: wire.JobQueued}, err
		}
	}
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
	return s.Send(ctx, settlement.Report{Finish: rep.Finish, Abandon: rep.Abandon})
}

// release gives a never-accepted claim back (R33, R36) under the receipt
// policy: up to Tries tries of TryTimeout, Wait apart; only transient
// failures are retried. settlement has no release call, so it lives here.
func (d *Daemon) release(ctx context.Context, id diagnostics.Attempt, token string, req wire.ReleaseRequest) error {
	p := d.cfg.Receipts
	tries, wait, timeout := p.Tries, p.Wait, p.TryTimeout
	if tries <= 0 {
		tries = settlement.DefaultTries
	}
	if wait <= 0 {
		wait = settlement.DefaultWait
	}
	if timeout <= 0 {
		timeout = settlement.DefaultTryTimeout
	}
	for try := 1; ; try++ {
		tctx, cancel := context.WithTimeout(ctx, timeout)
		err := d.control.Release(tctx, token, id.JobID, req)
		cancel()
		if err == nil {
			d.logAttempt(slog.LevelInfo, MsgTurnReleased, id, slog.String(diagnostics.KeyClass, req.Class))
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		d.rec.ControlFailure(context.Background(), wire.OpRelease, id, err)
		if wire.Classify(err) != wire.Transient || try >= tries {
			return err
		}
		if !sleep(ctx.Done(), wait) {
			return ctx.Err()
		}
	}
}

// rejectsLease: an answer that means this attempt's lease is gone.
func rejectsLease(err error) bool {
	var se *wire.StatusError
	if !errors.As(err, &se) {
		return false
	}
	switch wire.ClassifyStatus(se.Status) {
	case wire.CredentialRefused:
		return true
	case wire.Definitive:
		return se.Code != wire.CodeAdmitted && se.Code != wire.CodeNotAdmitted && se.Code != wire.CodeConversationLost
	}
	return false
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
