package runner

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/heartbeat"
	"github.com/runnerd/runnerd/wire"
)

// Decisions of the restart path, as MsgRecovered's decision field names them.
const (
	decisionResent      = "resent"      // the persisted report was sent again (P2)
	decisionWorkerLost  = "worker_lost" // no report: finished as worker lost (P6)
	decisionRejected    = "rejected"    // the lease is no longer ours: nothing written
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
//	no answer           retried until a whole lease has passed, then kept for
//	                    the next start (the reaper decides meanwhile)
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
	decide := func(decision string) string {
		d.logAttempt(slog.LevelInfo, MsgRecovered, a.id, slog.String(keyDecision, decision),
			slog.Bool("report_persisted", r.Report != nil))
		return decision
	}

	sent, ttl, ok := d.askLease(ctx, a)
	switch {
	case ctx.Err() != nil:
		return decide(decisionStopped)
	case !ok && ttl < 0:
		d.m.Turns.WithLabelValues("lease_lost").Inc()
		if err := d.state.remove(c.AttemptID); err != nil {
			d.logErrClass(slog.LevelError, MsgPersistFailed, a.id, "forget", err)
		}
		return decide(decisionRejected)
	case !ok:
		return decide(decisionUnreachable)
	}

	// The lease is ours: keep it renewed while the report goes out.
	hbAttempt := heartbeat.Attempt{
		JobID: c.JobID, AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration,
		WorkerToken: c.WorkerToken, LeaseTTL: ttl, ClaimSent: sent,
	}
	a.renewer = heartbeat.Start(heartbeat.Config{Timings: d.cfg.Timings, Client: d.renew, Logger: d.log}, hbAttempt)
	d.m.LeasesHeld.Inc()
	defer d.m.LeasesHeld.Dec()
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

	decision, rep, outcome := decisionResent, report{}, "resent"
	if r.Report != nil {
		rep = *r.Report
	} else {
		decision, outcome = decisionWorkerLost, wire.OutcomeWorkerLost
		rep = report{Finish: &wire.FinishRequest{
			AttemptRef: a.ref, Outcome: wire.OutcomeWorkerLost, Class: ClassWorkerLost,
			Reason: "the host daemon restarted while the turn ran",
		}}
	}
	d.finish(ctx, a, rep, outcome)
	switch {
	case ctx.Err() != nil:
		return decide(decisionStopped)
	case a.stopReason() == stopLease:
		return decide(decisionRejected)
	case d.state.exists(c.AttemptID):
		return decide(decisionUnsent)
	}
	return decide(decision)
}

// askLease renews the attempt's lease once to learn whether it is still
// ours: ok with the renewal's send time and granted lease; not ok with a
// negative ttl when the control plane rejected it; not ok otherwise when no
// answer came for a whole lease (or ctx ended). Transient failures are
// retried every RetryDelay.
func (d *Daemon) askLease(ctx context.Context, a *attempt) (sent time.Time, ttl time.Duration, ok bool) {
	t := d.cfg.Timings
	giveUp := time.Now().Add(t.LeaseTTL)
	req := wire.RenewRequest{AttemptRef: a.ref, LeaseTTLMS: t.LeaseTTL.Milliseconds()}
	for failures := 0; ; {
		sent = time.Now()
		rctx, cancel := context.WithTimeout(ctx, t.RequestTimeout)
		resp, err := d.renew.Renew(rctx, a.claim.WorkerToken, a.claim.JobID, req)
		cancel()
		if err == nil {
			return sent, time.Duration(resp.LeaseTTLMS) * time.Millisecond, true
		}
		if ctx.Err() != nil {
			return sent, 0, false
		}
		switch wire.Classify(err) {
		case wire.Definitive, wire.CredentialRefused, wire.Permanent:
			return sent, -1, false
		}
		if failures++; failures == 1 {
			d.rec.ControlFailure(context.Background(), wire.OpRenew, a.id, err)
		}
		if time.Now().Add(t.RetryDelay).After(giveUp) || !sleep(ctx.Done(), t.RetryDelay) {
			return sent, 0, false
		}
	}
}
