package runner

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/handover"
	"github.com/runnerd/runnerd/heartbeat"
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
//	                    and is reported by this daemon; otherwise build the
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
// and a re-attached turn holds its slot until it ends. recoverAll returns
// once every attempt is resolved or re-attached.
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

// recoverOne resolves one persisted attempt and returns its decision.
func (d *Daemon) recoverOne(ctx context.Context, r record) string {
	c := r.Claim
	a := d.newAttempt(&c)
	a.claimedAt = r.ClaimedAt
	decide := func(decision string) string {
		d.logAttempt(slog.LevelInfo, MsgRecovered, a.id, slog.String(keyDecision, decision),
			slog.Bool("report_persisted", r.Report != nil))
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
		if d.reattach(ctx, a) {
			return decide(decisionReattached)
		}
	}
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
			return decide(decisionRejected)
		}
	default:
		decision, outcome = decisionWorkerLost, wire.OutcomeWorkerLost
		rep = settlement.Report{Finish: &wire.FinishRequest{
			AttemptRef: a.ref, Outcome: wire.OutcomeWorkerLost, Class: ClassWorkerLost,
			Reason: "the host daemon restarted while the turn ran",
		}}
	}
	d.finish(ctx, a, rep, outcome)
	switch {
	case ctx.Err() != nil:
		return decide(decisionStopped)
	case d.state.exists(c.AttemptID):
		// Kept: refused, or the lease expired locally with no verdict (K1).
		return decide(decisionUnsent)
	case a.stopReason() == stopLease:
		return decide(decisionRejected)
	}
	return decide(decision)
}

// reattachConfig is the handover configuration of a re-attached turn: the
// launch's, with the execution timeout left since the claim.
func (d *Daemon) reattachConfig(a *attempt) handover.Config {
	cfg := d.handoverConfig(a)
	cfg.ExecutionTimeout = max(cfg.ExecutionTimeout-time.Since(a.claimedAt), time.Second)
	return cfg
}

// reattach takes over the attempt's turn child if it is still there (P5):
// its newly renewed lease goes to the child, and the turn runs on as one
// this daemon launched, holding a slot until it ends. false: no child to
// re-attach to (gone, never accepted, or of a protocol version this daemon
// does not speak: then it has been stopped).
func (d *Daemon) reattach(runCtx context.Context, a *attempt) bool {
	// Not runCtx: its end is the handover, which leaves the child running.
	t, err := handover.Reattach(context.WithoutCancel(runCtx), d.reattachConfig(a), a.echo(), d.bootLease(a.renewer.Lease()))
	var ve *handover.VersionError
	if errors.As(err, &ve) {
		d.logReattachRefused(a.id, ve.Version)
	}
	if err != nil {
		return false
	}
	d.logReattached(a.id, t.PID(), t.Orphaned())
	conv := a.claim.Turn.ConversationID
	d.holdSlot()
	d.holdConversation(conv)
	d.attempts.Add(1)
	go func() {
		defer d.attempts.Done()
		defer d.freeSlot()
		defer d.releaseConversation(conv)
		defer d.m.holdLease(d.leaseLeft(a.renewer))()
		defer func() { a.renewer.Stop(); <-a.renewer.Done() }()
		defer d.watchCancel(a)() // a cancel reaches a re-attached turn the fast way too (K10)
		d.superviseTurn(runCtx, a, t)
	}()
	return true
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
