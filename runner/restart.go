package runner

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/handover"
	"github.com/runnerd/runnerd/heartbeat"
	"github.com/runnerd/runnerd/internal/boottime"
	"github.com/runnerd/runnerd/internal/retry"
	"github.com/runnerd/runnerd/runner/turn"
	"github.com/runnerd/runnerd/settlement"
	"github.com/runnerd/runnerd/wire"
)

// Decisions of the restart path, as MsgRecovered's decision field names them.
const (
	decisionResent      = "resent"      // the persisted report was sent again (P2)
	decisionWorkerLost  = "worker_lost" // no report: finished as worker lost (P6)
	decisionRejected    = "rejected"    // the lease is no longer ours: nothing written
	decisionRefused     = "refused"     // the lease question was refused with a status no retry changes (400): kept for a person
	decisionUnreachable = "unreachable" // no answer for a whole lease: kept for the next start
	decisionUnsent      = "unsent"      // the lease was ours but the report could not be sent
	decisionStopped     = "stopped"     // the daemon was stopped meanwhile
	decisionReattached  = "reattached"  // the turn child was there: it goes on under this daemon (P5)
	decisionFromResult  = "from_result" // the child's persisted RESULT was reported
	decisionPending     = "pending"     // the child may be running but could not be re-attached yet: tried again (awaitReattach)
	decisionKilled      = "killed"      // a child never re-attached was killed for a cancel, the drain or the execution timeout, and reported so
)

// recoverAll resolves every attempt an earlier run left in the state
// directory, before the first claim (P5, P6, R31). Turn children outlive
// the daemon: one that had accepted waits on its re-attach socket, fenced
// by its own lease deadline (K5). For each attempt the control plane is
// asked first, with a renewal under the attempt's own worker token:
//
//	answered 200        the lease is still ours: with no report persisted,
//	                    re-attach to the child if it is there — it goes on
//	                    as if nothing had happened (runnerd_turn_reattached)
//	                    and is reported by this daemon; one that may be
//	                    running but cannot be re-attached now (silent,
//	                    unwatchable) is kept and tried again while it may
//	                    run (awaitReattach), never taken for gone; otherwise build the
//	                    report from the persisted RESULT, re-send the
//	                    persisted report (idempotent, P2), or, with neither,
//	                    finish as worker_lost (never admitted: requeued, not
//	                    counted, P6; admitted: the conversation becomes LOST
//	                    and is never replayed, R31)
//	409/410/401/403/404 the lease is gone: a surviving child is stopped
//	                    (lease_lost: it writes nothing more), never
//	                    re-attached; write nothing, forget the attempt
//	400 (our bug)       runnerd_report_refused; kept for a person
//	no verdict          transport failures, 408, 429, 5xx: retried under the
//	                    report policy (K1) until a whole lease has passed,
//	                    then kept for the next start (the reaper decides
//	                    meanwhile; the child fences itself)
//
// The attempts are resolved concurrently; each holds a slot while it is,
// and a re-attached (or pending) turn holds its slot until it ends.
// recoverAll returns once every attempt is resolved, re-attached or
// pending.
func (d *Daemon) recoverAll(ctx context.Context) {
	d.state.sweepTemp()
	recs, bad := d.state.load()
	for _, name := range bad {
		d.log.LogAttrs(context.Background(), slog.LevelError, MsgStateCorrupt, slog.String(keyFile, name))
	}
	var wg sync.WaitGroup
	for _, r := range recs {
		d.holdSlot()
		wg.Go(func() {
			defer d.freeSlot()
			d.recoverOne(ctx, r)
		})
	}
	wg.Wait()
}

// recoverOne resolves one persisted attempt and returns its decision;
// decisionPending when its child may be running but could not be
// re-attached yet, which is decided (and recorded) later.
func (d *Daemon) recoverOne(ctx context.Context, r record) string {
	c := r.Claim
	a := d.newAttempt(&c)
	a.claimedAt, a.claimedBoot = r.ClaimedAt, r.ClaimedBoot
	decide := func(decision string) string {
		d.logRecovered(a, r, decision)
		return decision
	}

	sent, ttl, answer := d.askLease(ctx, a)
	switch {
	case ctx.Err() != nil:
		return decide(decisionStopped)
	case answer == leaseRejected:
		d.stopOrphan(a, r)
		d.m.turnEnded("lease_lost", a.claimedAt)
		if err := d.state.remove(c.AttemptID); err != nil {
			d.logErrClass(slog.LevelError, MsgPersistFailed, a.id, "forget", err)
		}
		return decide(decisionRejected)
	case answer == leaseRefused:
		return decide(decisionRefused)
	case answer != leaseOurs:
		return decide(decisionUnreachable)
	}

	// The lease is ours: keep it renewed while the turn or its report goes on.
	hbAttempt := heartbeat.Attempt{
		JobID: c.JobID, AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration,
		WorkerToken: c.WorkerToken, LeaseTTL: ttl, ClaimSent: sent,
	}
	d.startRenewer(a, hbAttempt)
	if r.Report == nil {
		switch decision := d.reattach(ctx, a, r); decision {
		case decisionReattached:
			return decide(decision)
		case decisionPending:
			return decision
		}
	}
	return decide(d.settleRecovered(ctx, a, r, nil))
}

func (d *Daemon) logRecovered(a *attempt, r record, decision string) {
	d.logAttempt(slog.LevelInfo, MsgRecovered, a.id, slog.String(keyDecision, decision),
		slog.Bool("report_persisted", r.Report != nil))
}

// settleRecovered reports a recovered attempt whose lease is ours and whose
// child is gone (or never re-attached), and returns the decision: the
// persisted report again, the one built from the persisted RESULT, the one
// of a child the daemon had to kill (killed, how it ended), or worker_lost.
// It stops the renewer.
func (d *Daemon) settleRecovered(ctx context.Context, a *attempt, r record, killed *handover.Ended) string {
	c := r.Claim
	defer d.m.holdLease(d.leaseLeft(a.renewer))()
	over := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-a.renewer.Done():
			if a.renewer.Verdict().Outcome != heartbeat.Stopped {
				a.stop(stopLease)
			}
		case <-over:
		}
	}()
	defer func() { a.renewer.Stop(); <-a.renewer.Done(); close(over); <-watched }()

	decision, rep, outcome := decisionResent, settlement.Report{}, "resent"
	switch {
	case r.Report != nil:
		rep = *r.Report
	case r.Result != nil:
		// The child's RESULT was kept but the report not yet built: the
		// turn ended as the child said, and its report goes out now.
		decision = decisionFromResult
		rep, outcome = d.reportOf(a, handover.Ended{Outcome: handover.OutcomeResult, Result: r.Result, ExitCode: -1})
		if childSawLeaseRejected(handover.Ended{Outcome: handover.OutcomeResult, Result: r.Result}) {
			d.forget(a, "lease_lost")
			return decisionRejected
		}
	case killed != nil:
		// The daemon ended the child it could not re-attach: for the user's
		// cancel, the drain or the execution timeout (K6).
		decision = decisionKilled
		rep, outcome = d.reportOf(a, *killed)
		if class, failed := rep.Failed(); failed {
			d.rec.TurnFailed(context.Background(), a.id, diagnostics.StageTurn, class)
		}
	default:
		decision, outcome = decisionWorkerLost, wire.OutcomeWorkerLost
		rep = settlement.Report{Finish: &wire.FinishRequest{
			AttemptRef: a.ref, Outcome: wire.OutcomeWorkerLost, Class: ClassWorkerLost,
			Reason: "the host daemon restarted while the turn ran",
			Cause:  wire.CauseDaemonRestart, CauseEvidence: "the restarted daemon found the attempt's state file and no turn child to re-attach",
		}}
	}
	d.finish(ctx, a, rep, outcome)
	switch {
	case ctx.Err() != nil:
		return decisionStopped
	case d.state.exists(c.AttemptID):
		// Kept: refused, or the lease expired locally with no verdict (K1).
		return decisionUnsent
	case a.stopReason() == stopLease:
		return decisionRejected
	}
	return decision
}

// execDeadline is when the daemon's own timer ends the attempt's turn
// (ExecTimeout and its margin after the claim), on CLOCK_BOOTTIME: a step
// of the wall clock moves it neither way. A record of a release before
// ClaimedBoot counts from the wall-clock claim time.
func (d *Daemon) execDeadline(a *attempt) boottime.Instant {
	total := d.cfg.ExecTimeout + d.cfg.ExecTimeoutMargin
	if a.claimedBoot.IsZero() {
		return boottime.Now().Add(total - time.Since(a.claimedAt))
	}
	return a.claimedBoot.Add(total)
}

// reattachConfig is the handover configuration of a re-attached turn: the
// launch's, with the execution timeout left until execDeadline.
func (d *Daemon) reattachConfig(a *attempt) handover.Config {
	cfg := d.handoverConfig(a)
	cfg.ExecutionTimeout = max(d.execDeadline(a).Sub(boottime.Now()), time.Second)
	return cfg
}

// reattach takes over the attempt's turn child if it is still there (P5):
// its newly renewed lease goes to the child, and the turn runs on as one
// this daemon launched, holding a slot until it ends (decisionReattached).
// A child that may be running but could not be re-attached at once
// (handover.Unattached: frozen, busy, or this daemon out of descriptors)
// is no evidence of its absence: its record, renewer and slot are kept and
// awaitReattach tries again (decisionPending). "" means no child to
// re-attach to: gone, never accepted, or of a protocol version this daemon
// does not speak (then it has been stopped).
func (d *Daemon) reattach(runCtx context.Context, a *attempt, r record) string {
	t, err := d.tryReattach(runCtx, a)
	var ua *handover.Unattached
	switch {
	case err == nil:
	case errors.As(err, &ua):
		d.logReattachPending(a.id, ua, 0, 0)
	default:
		return ""
	}
	conv := a.claim.Turn.ConversationID
	d.holdSlot()
	d.holdConversation(conv)
	d.attempts.Add(1)
	go func() {
		defer d.attempts.Done()
		defer d.freeSlot()
		defer d.releaseConversation(conv)
		defer d.watchCancel(a)() // a cancel reaches a re-attached turn the fast way too (K10)
		if t == nil {
			var end pendingEnd
			if t, end = d.awaitReattach(runCtx, a, ua); t == nil {
				d.logRecovered(a, r, d.pendingOver(runCtx, a, r, end))
				return
			}
			d.logRecovered(a, r, decisionReattached)
		}
		defer d.m.holdLease(d.leaseLeft(a.renewer))()
		defer func() { a.renewer.Stop(); <-a.renewer.Done() }()
		d.superviseTurn(runCtx, a, t)
	}()
	if t == nil {
		return decisionPending
	}
	return decisionReattached
}

// tryReattach is one try of handover.Reattach with the lease as it stands.
func (d *Daemon) tryReattach(runCtx context.Context, a *attempt) (*handover.Turn, error) {
	// Not runCtx: its end is the handover, which leaves the child running.
	cfg := d.reattachConfig(a)
	t, err := handover.Reattach(context.WithoutCancel(runCtx), cfg, a.echo(), d.bootLease(a.renewer.Lease()))
	var ve *handover.VersionError
	if errors.As(err, &ve) {
		d.logReattachRefused(a.id, ve.Version)
	}
	if err == nil {
		d.logReattached(a.id, t.PID(), t.Orphaned(), cfg.ExecutionTimeout)
	}
	return t, err
}

// How awaitReattach ended without a turn.
type pendingEnd int

const (
	pendingGone       pendingEnd = iota // the child exited by itself (or was of another version)
	pendingKilled                       // the daemon killed it: a stop reason or the execution timeout
	pendingTimedOut                     // killed for the execution timeout (K6)
	pendingLeaseLost                    // the lease is gone: write nothing
	pendingHandedOver                   // the handover: the child is the next start's
)

// awaitReattach tries again, under its backoff, to re-attach a child that
// may still be running but could not be taken over (first), for as long
// as it may be running: until a try takes it over, or /proc shows it gone.
// The lease is renewed meanwhile, and the child, which hears nothing of
// the renewals, fences itself by its own lease deadline (K5): it stops its
// agent and exits, and is gone. The daemon ends it first only on evidence:
// the lease is gone, the user cancelled, the drain timed out, or the
// execution deadline passed (K6) — it is killed (by a pidfd of the process
// with its start time) and awaited. It never takes a child that may still
// run for gone. A handover leaves it for the next start.
func (d *Daemon) awaitReattach(runCtx context.Context, a *attempt, first *handover.Unattached) (*handover.Turn, pendingEnd) {
	defer d.m.holdLease(d.leaseLeft(a.renewer))()
	tries := retry.Policy{Name: "reattach", Wait: d.cfg.Timings.RetryDelay, MaxWait: d.cfg.Timings.Interval}.Backoff()
	deadline := d.execDeadline(a)
	ua, killed, timedOut := first, false, false
	for n := 1; ua.Alive(); n++ {
		pause := tries.NextBackOff()
		timer := time.NewTimer(pause)
		w := &a.heard
		select {
		case <-w.renewerDone:
			a.renewerEnded()
		case <-w.cancelled:
			a.cancel(cancelViaRenewal)
		case <-w.hostCancelled:
			a.cancel(cancelViaHostPoll)
		case <-w.drained:
			a.drained()
		case <-d.handingOver:
			timer.Stop()
			return nil, pendingHandedOver
		case <-timer.C:
		}
		timer.Stop()
		why := a.stopReason()
		if why == stopLease {
			ua.Kill() // it writes nothing more; its record is forgotten
			return nil, pendingLeaseLost
		}
		t, err := d.tryReattach(runCtx, a)
		if err == nil {
			if why != stopNone {
				t.StopWith(why.stopClass()) // heard while it was not attached
			}
			return t, 0
		}
		var next *handover.Unattached
		if !errors.As(err, &next) {
			break // gone (ErrNoChild), or of another version and stopped
		}
		d.logReattachPending(a.id, next, n, pause)
		if next.PID != 0 || ua.PID == 0 {
			ua = next // one that could not reach the socket knows no pid: keep the last that did
		}
		if past := !boottime.Now().Before(deadline); why != stopNone || past {
			ua.Kill()
			killed, timedOut = true, timedOut || past
		}
	}
	switch {
	case timedOut:
		return nil, pendingTimedOut
	case killed:
		return nil, pendingKilled
	}
	return nil, pendingGone
}

// pendingOver resolves an attempt whose child awaitReattach never took
// over, and returns its decision.
func (d *Daemon) pendingOver(runCtx context.Context, a *attempt, r record, end pendingEnd) string {
	switch end {
	case pendingHandedOver:
		a.renewer.Stop()
		<-a.renewer.Done()
		return decisionStopped
	case pendingLeaseLost:
		if expiredLocally(a.renewer) {
			// No answer for a whole lease is no verdict: the next start asks.
			return decisionUnreachable
		}
		d.forget(a, "lease_lost")
		return decisionRejected
	case pendingKilled, pendingTimedOut:
		return d.settleRecovered(runCtx, a, r, &handover.Ended{
			Outcome: handover.OutcomeKilled, ExitCode: -1, Signal: syscall.SIGKILL,
			Stopped: end == pendingKilled, TimedOut: end == pendingTimedOut,
		})
	}
	return d.settleRecovered(runCtx, a, r, nil)
}

// stopOrphan stops a surviving child of an attempt whose lease is no
// longer ours: STOP lease_lost, so that it writes nothing more; it is
// never re-attached, and its RESULT is not kept.
func (d *Daemon) stopOrphan(a *attempt, r record) {
	if r.Report != nil {
		return // its RESULT was delivered: the child is gone
	}
	cfg := d.reattachConfig(a)
	cfg.OnProgress, cfg.OnResult, cfg.Leases = nil, nil, nil
	t, err := handover.Reattach(context.Background(), cfg, a.echo(), handover.Lease{})
	var ua *handover.Unattached
	if errors.As(err, &ua) {
		ua.Kill() // it cannot hear a STOP; its own deadline would end it too (K5)
	}
	if err != nil {
		return
	}
	t.StopWith(turn.StopLeaseLost)
	t.Wait()
	d.logAttempt(slog.LevelWarn, MsgTurnStopped, a.id, slog.String(keyOutcome, stopLease.String()), slog.String(keyDecision, "not_reattached"))
}

// What the restart's lease question learned.
type leaseAnswer int

const (
	leaseUnknown  leaseAnswer = iota // no verdict for a whole lease, or ctx ended
	leaseOurs                        // 200: the lease is ours again
	leaseRejected                    // 409/410/401/403/404: the lease is gone
	leaseRefused                     // a status no retry changes (400): our bug
)

// askLease renews the attempt's lease to learn whether it is still ours,
// under the report policy (K1) paced as a renewal — each try bounded by the
// renewal timeout (R3), the next one RetryDelay later (R4) — through a
// retryablehttp client over the renewal transport, whose context is the
// local lease's validity: a lease can be valid no longer than one lease
// after our last acknowledged renewal, so the question is asked for a whole
// lease and no pause that would outlast it is started. It returns the send
// time of the answered try and the lease it granted. A refusal is recorded
// (runnerd_report_refused); the first failure of an outage once.
func (d *Daemon) askLease(ctx context.Context, a *attempt) (sent time.Time, ttl time.Duration, answer leaseAnswer) {
	t := d.cfg.Timings
	ctx, cancel := context.WithTimeout(ctx, t.LeaseTTL)
	defer cancel()
	policy := settlement.ReportPolicy(d.cfg.Reports)
	policy.TryTimeout, policy.Wait, policy.MaxWait = t.RequestTimeout, t.RetryDelay, t.RetryDelay
	asked := wire.Client{BaseURL: d.renew.BaseURL, HTTP: policy.HTTP(sentAt{d.renew.HTTP.Transport, &sent}, func(f retry.Failure) {
		if f.Try == 1 {
			d.rec.ControlFailure(context.Background(), wire.OpRenew, a.id, f.Err)
		}
	})}
	resp, err := asked.Renew(ctx, a.claim.WorkerToken, a.claim.JobID, wire.RenewRequest{AttemptRef: a.ref, LeaseTTLMS: t.LeaseTTL.Milliseconds()})
	switch cls := wire.Classify(err); {
	case err == nil:
		return sent, time.Duration(resp.LeaseTTLMS) * time.Millisecond, leaseOurs
	case cls == wire.Definitive || cls == wire.CredentialRefused:
		return sent, 0, leaseRejected
	case cls == wire.Permanent && diagnostics.Status(err) != 0:
		d.logErrClass(slog.LevelError, MsgReportRefused, a.id, wire.OpRenew, err)
		return sent, 0, leaseRefused
	}
	return sent, 0, leaseUnknown
}

// sentAt notes when each try of the lease question is sent: the answered
// one's send time starts the granted lease (R1).
type sentAt struct {
	base http.RoundTripper
	at   *time.Time
}

func (s sentAt) RoundTrip(req *http.Request) (*http.Response, error) {
	*s.at = time.Now()
	return s.base.RoundTrip(req)
}
