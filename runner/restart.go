package runner

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/heartbeat"
	"github.com/runnerd/runnerd/internal/retry"
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
)

// recoverAll resolves every attempt an earlier run left in the state
// directory, before the first claim (P5, P6, R31). Children die with the
// daemon (parent-death signal, and EOF on their descriptor), so no turn of
// an earlier run is still running: re-attachment to a surviving turn is not
// built. For each attempt the control plane is asked first, with a renewal
// under the attempt's own worker token:
//
//	answered 200        the lease is still ours: re-send the persisted report
//	                    (idempotent, P2), or, with none, finish as worker_lost
//	                    (never admitted: requeued, not counted, P6; admitted:
//	                    the conversation becomes LOST and is never replayed)
//	409/410/401/403/404 the lease is gone: write nothing, forget the attempt
//	400 (our bug)       runnerd_report_refused; kept for a person
//	no verdict          transport failures, 408, 429, 5xx: retried under the
//	                    report policy (K1) until a whole lease has passed,
//	                    then kept for the next start (the reaper decides
//	                    meanwhile)
//
// The attempts are resolved concurrently; each holds a slot while it is.
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
	a := &attempt{
		d:         d,
		claim:     c,
		claimedAt: r.ClaimedAt,
		id:        diagnostics.Attempt{JobID: c.JobID, AttemptID: c.AttemptID},
		ref:       wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration},
	}
	a.fenced, a.fence = context.WithCancel(context.Background())
	defer a.fence()
	a.reporter = d.newReporter(c)
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

	// The lease is ours: keep it renewed while the report goes out.
	hbAttempt := heartbeat.Attempt{
		JobID: c.JobID, AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration,
		WorkerToken: c.WorkerToken, LeaseTTL: ttl, ClaimSent: sent,
	}
	a.renewer = heartbeat.Start(heartbeat.Config{Timings: d.cfg.Timings, Client: d.renew, Logger: d.log, Clock: d.cfg.Clock}, hbAttempt)
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
	if r.Report != nil {
		rep = *r.Report
	} else {
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
// renewal timeout (R3), the next one RetryDelay later (R4) — for at most
// one lease: a lease can be valid no longer than that after our last
// acknowledged renewal. It returns the send time of the
// answered try and the lease it granted. A refusal is recorded
// (runnerd_report_refused); the first failure of an outage once.
func (d *Daemon) askLease(ctx context.Context, a *attempt) (sent time.Time, ttl time.Duration, answer leaseAnswer) {
	t := d.cfg.Timings
	ctx, cancel := context.WithTimeout(ctx, t.LeaseTTL)
	defer cancel()
	policy := settlement.ReportPolicy(d.cfg.Reports)
	policy.TryTimeout, policy.Wait, policy.MaxWait = t.RequestTimeout, t.RetryDelay, t.RetryDelay
	req := wire.RenewRequest{AttemptRef: a.ref, LeaseTTLMS: t.LeaseTTL.Milliseconds()}
	var resp wire.RenewResponse
	err := policy.Do(ctx, func(ctx context.Context) error {
		sent = time.Now()
		var err error
		resp, err = d.renew.Renew(ctx, a.claim.WorkerToken, a.claim.JobID, req)
		return err
	}, func(f retry.Failure) {
		if f.Try == 1 {
			d.rec.ControlFailure(context.Background(), wire.OpRenew, a.id, f.Err)
		}
	})
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
