package runner

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/internal/retry"
	"github.com/runnerd/runnerd/wire"
)

// idleCheck is how often a loop with nothing to do checks in with the watchdog.
const idleCheck = 5 * time.Second

// claimLoop long-polls for turns while there is free capacity, no launch
// backoff, no drain and an accepted host token. runCtx is Run's (its end is the
// handover); loops ends the loop.
func (d *Daemon) claimLoop(runCtx, loops context.Context) {
	// A drain or the handover cancels the long poll in flight.
	claimCtx, cancel := context.WithCancel(loops)
	defer cancel()
	defer context.AfterFunc(runCtx, cancel)()
	defer context.AfterFunc(d.drainCtx, cancel)()
	c := &claimer{
		d:       d,
		runCtx:  runCtx,
		ctx:     claimCtx,
		stop:    claimCtx.Done(),
		backoff: retry.Policy{Name: "claim", Wait: d.cfg.ClaimBackoff, MaxWait: d.cfg.ClaimBackoffMax, Jitter: d.cfg.Jitter}.Backoff(),
		batches: true,
	}
	for c.ctx.Err() == nil && c.next() {
	}
}

// claimer is the claim loop's state and the side effects of each of its
// events: one claim request's answer, a failure, an idle pause. It lives on
// the claim loop's goroutine alone.
type claimer struct {
	d      *Daemon
	runCtx context.Context // Run's: an attempt outlives the loop, not Run
	ctx    context.Context // the loop's: a drain or the handover ends it
	stop   <-chan struct{} // ctx.Done()

	// backoff paces failed claims, never giving up; failing says the last
	// claim failed (so a recovery is recorded once).
	backoff *backoff.ExponentialBackOff
	failing bool
	// pending is the claim in progress: its idempotency key, the send of
	// its first request and how many turns it asked for. A claim whose
	// answer never came is asked again, the same request with the same
	// key, so the attempts it may have made are resumed, not orphaned.
	pending struct {
		key  string
		sent time.Time
		n    int
	}
	// batches: the control plane takes max_claims. One that predates
	// batched claims refuses the field (400 unknown_field); from then on
	// this daemon claims one turn per request.
	batches bool
	// pinnedRefused: the control plane refused pinned_only (400
	// unknown_field, older than S2): under pressure nothing is claimed.
	pinnedRefused bool
}

// next makes one step of the loop: a claim, or a pause when none may be
// made. It reports false when the loop must end.
func (c *claimer) next() bool {
	d := c.d
	if d.isHostRefused() || d.isInUse() || !d.backendReady() {
		return c.idle()
	}
	if p := d.gate.pause(time.Now()); p > 0 {
		return c.wait(p)
	}
	// S2: short of disk or memory even with the idle sandboxes stopped,
	// the host takes no conversation's first turn.
	pinned := d.withholdFirstTurns(c.ctx)
	if pinned && c.pinnedRefused {
		return c.idle()
	}
	limit := 1 // every free slot, in one request
	if c.batches {
		limit = wire.MaxClaimsPerRequest
	}
	sent := time.Now()
	again := c.pending.key != "" && sent.Sub(c.pending.sent) < d.cfg.Timings.LeaseTTL
	if again {
		limit = c.pending.n // a retry asks for what the first request did
	}
	n := d.takeSlots(limit)
	if n == 0 {
		return c.idle()
	}
	d.health.expect(loopClaim, d.cfg.ClaimWait+d.cfg.ControlTimeout+healthSlack)
	if !again {
		// A new claim (or one so old that its attempts' leases are over).
		c.pending.key, c.pending.sent, c.pending.n = rand.Text(), sent, n
	}
	ctx, cancelClaim := context.WithTimeout(c.ctx, d.cfg.ClaimWait+d.cfg.ControlTimeout)
	got, err := d.control.Claims(ctx, d.hostToken(), wire.ClaimRequest{
		WaitMS:         d.cfg.ClaimWait.Milliseconds(),
		LeaseTTLMS:     d.cfg.Timings.LeaseTTL.Milliseconds(),
		IdempotencyKey: c.pending.key,
		MaxClaims:      c.pending.n,
		PinnedOnly:     pinned,
	})
	cancelClaim()
	first := c.pending.sent
	if missing := err != nil && !errors.Is(err, wire.ErrNoClaim) && wire.Classify(err) == wire.Transient; !missing || c.ctx.Err() != nil {
		c.pending.key = "" // answered (or given up): the next claim is a new one
	}
	var se *wire.StatusError
	switch status := diagnostics.Status(err); {
	case err == nil:
		d.claimDone(len(got))
		c.claimed(got, first)
		return true
	case c.ctx.Err() != nil:
		d.claimDone(0)
		return false
	case errors.Is(err, wire.ErrNoClaim):
		d.claimDone(0)
		return c.noClaim()
	case wire.Classify(err) == wire.CredentialRefused && status != http.StatusNotFound:
		d.claimDone(0)
		d.m.claimFailed(err)
		d.refuseHost("claim", status)
	case isInUse(err):
		d.claimDone(0)
		d.m.claimFailed(err)
		d.markInUse("claim")
	case pinned && errors.As(err, &se) && se.Code == wire.CodeUnknownField:
		d.claimDone(0)
		c.pinnedRefused = true
		d.log.LogAttrs(context.Background(), slog.LevelWarn, MsgClaimPinnedRefused, slog.String(diagnostics.KeyOp, "claim"))
	case c.batches && c.pending.n > 1 && errors.As(err, &se) && se.Code == wire.CodeUnknownField:
		d.claimDone(0)
		c.batches = false
		d.log.LogAttrs(context.Background(), slog.LevelWarn, MsgClaimBatchRefused, slog.String(diagnostics.KeyOp, "claim"))
	default:
		d.claimDone(0)
		return c.failed(err, status)
	}
	return true
}

// claimed starts every turn of an answer; their leases count from the
// claim's first send (K4).
func (c *claimer) claimed(got []wire.Claim, first time.Time) {
	c.failing = false
	c.backoff.Reset()
	for _, claim := range got {
		c.d.m.ClaimWait.Observe(time.Since(first).Seconds())
		if claim.QueuedMS != nil { // nil: a control plane that does not say
			c.d.m.QueueWait.Observe((time.Duration(*claim.QueuedMS) * time.Millisecond).Seconds())
		}
		c.d.startAttempt(c.runCtx, claim, first)
	}
}

// noClaim follows a long poll that ended with nothing to run.
func (c *claimer) noClaim() bool {
	if c.failing {
		c.failing = false
		c.d.log.LogAttrs(context.Background(), slog.LevelInfo, MsgControlRecovered, slog.String(diagnostics.KeyOp, "claim"))
	}
	c.backoff.Reset()
	// The long poll already waited; a short random pause keeps a fleet's
	// polls apart.
	return c.wait(spread(c.d.cfg.ClaimBackoff / 2))
}

// failed follows a claim that failed for a reason worth retrying: the
// first failure of a run is recorded, every one waits out the backoff.
func (c *claimer) failed(err error, status int) bool {
	d := c.d
	d.m.claimFailed(err)
	if !c.failing {
		c.failing = true
		d.endpointMissing("claim", status)
		d.rec.ControlFailure(context.Background(), "claim", diagnostics.Attempt{}, err)
	}
	return c.wait(c.backoff.NextBackOff())
}

// idle waits for a freed slot or the next check-in with the watchdog.
func (c *claimer) idle() bool {
	c.d.health.expect(loopClaim, idleCheck+healthSlack)
	t := time.NewTimer(idleCheck)
	defer t.Stop()
	select {
	case <-c.stop:
		return false
	case <-c.d.slotFreed:
	case <-t.C:
	}
	return true
}

// wait pauses for dur, telling the watchdog so.
func (c *claimer) wait(dur time.Duration) bool {
	c.d.health.expect(loopClaim, dur+healthSlack)
	return sleep(c.stop, dur)
}

// startAttempt runs a claimed turn on its own goroutine. Its lease counts from
// the first request's send: a replayed answer's lease began with that
// request (K4, R10).
func (d *Daemon) startAttempt(runCtx context.Context, claim wire.Claim, sent time.Time) {
	d.attempts.Add(1)
	conv := claim.Turn.ConversationID
	d.holdConversation(conv) // before the sweep can look again
	start := leaseStart(sent, claim.Held(), time.Now())
	go func() {
		defer d.attempts.Done()
		defer d.freeSlot()
		defer d.releaseConversation(conv)
		d.runAttempt(runCtx, &claim, start)
	}()
}

// leaseStart is when the runner counts a claimed lease from (K4): the
// claim request's send plus the time the control plane says it held the
// long poll before granting it. The server set the lease's expiry no
// earlier than that (it measured the hold from the request's arrival),
// so the local deadline is still never later than the server's (R10),
// and a long claim wait no longer eats the lease. The hold counts at most
// what passed here between send and answer (answered), so a server whose
// clock runs fast cannot move the start past the answer.
func leaseStart(sent time.Time, held time.Duration, answered time.Time) time.Time {
	return sent.Add(min(held, answered.Sub(sent)))
}

// hostBeatLoop reports the host's status every HostHeartbeatInterval (with
// jitter), and at once when a drain begins: capacity, running turns,
// draining, launch_error (R37). The first acknowledged one sends READY=1.
func (d *Daemon) hostBeatLoop(ctx context.Context) {
	stop := ctx.Done()
	ready, failing := false, false
	for {
		d.health.expect(loopBeat, d.cfg.ControlTimeout+d.cfg.HostHeartbeatInterval*2+healthSlack)
		if !d.isHostRefused() {
			err := d.sendHostBeat(ctx, false)
			if ctx.Err() == nil {
				d.noteBeat(time.Now(), err)
			}
			status := diagnostics.Status(err)
			switch {
			case err == nil:
				d.clearInUse()
				if failing {
					failing = false
					d.log.LogAttrs(context.Background(), slog.LevelInfo, MsgControlRecovered, slog.String(diagnostics.KeyOp, "host_heartbeat"))
				}
				if !ready && d.backendReady() {
					ready = true
					d.notify(notifyReady)
				}
			case ctx.Err() != nil:
				return
			case wire.Classify(err) == wire.CredentialRefused && status != http.StatusNotFound:
				d.refuseHost("host_heartbeat", status)
			case isInUse(err):
				// The control plane answered: the daemon is up, kept from
				// claiming while the other instance is live.
				d.markInUse("host_heartbeat")
				if !ready {
					ready = true
					d.notify(notifyReady)
				}
			default:
				if !failing {
					failing = true
					d.endpointMissing("host_heartbeat", status)
					d.rec.ControlFailure(context.Background(), "host_heartbeat", diagnostics.Attempt{}, err)
				}
			}
		}
		d.notifyStatus(ready)
		t := time.NewTimer(jitter(d.cfg.HostHeartbeatInterval, d.cfg.Jitter))
		select {
		case <-stop:
			t.Stop()
			return
		case <-d.kickBeat:
		case <-t.C:
		}
		t.Stop()
	}
}

// sendHostBeat sends one host heartbeat with the host's status now;
// stopping: the daemon's last, releasing the host token (instance.go).
func (d *Daemon) sendHostBeat(ctx context.Context, stopping bool) error {
	hb := wire.HostHeartbeat{
		Capacity:    d.cfg.Capacity,
		Running:     d.running(),
		Draining:    d.draining(),
		LaunchError: d.gate.report(),
		Version:     d.cfg.Version,
		IntervalMS:  d.cfg.HostHeartbeatInterval.Milliseconds(),

		ClaimsWithheld:  d.claimsWithheld(),
		Labels:          d.cfg.Labels,
		SandboxPressure: d.pressure.heartbeat(),
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.ControlTimeout)
	defer cancel()
	c := d.control
	if stopping {
		c = stoppingClient(c)
	}
	resp, err := c.HostHeartbeat(ctx, d.hostToken(), hb)
	if err == nil {
		// The first contact pins the cluster; a changed one is said at once,
		// not only when the sweep next asks (K8).
		d.trustCluster(resp.ClusterID)
		d.adoptHostToken(resp.HostToken)
	}
	return err
}
