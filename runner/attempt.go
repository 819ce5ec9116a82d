package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/handover"
	"github.com/runnerd/runnerd/heartbeat"
	"github.com/runnerd/runnerd/internal/boottime"
	"github.com/runnerd/runnerd/runner/turn"
	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/settlement"
	"github.com/runnerd/runnerd/wire"
)

// Classes of reports the daemon builds itself when the child gave none.
const (
	ClassChildExited      = "child_exited"
	ClassKilled           = "killed"
	ClassExecutionTimeout = handover.ClassExecutionTimeout
	ClassBadResult        = "bad_result"
	ClassStateUnwritable  = "state_unwritable"
	ClassWorkerLost       = "daemon_restarted"
	ClassHostStopped      = turn.ClassHostStopped
	ClassReleaseRefused   = settlement.ClassReleaseRefused
)

// Why the daemon stopped a turn. The first reason wins; lease loss
// overrides everything, because then nothing more is written.
type stopReason int

const (
	stopNone   stopReason = iota
	stopCancel            // the user's cancel, from a renewal answer (P7)
	stopDrain             // the drain timeout passed, or EndDrain
	stopLease             // the lease is gone: write nothing (R8, R10, R11)
)

func (s stopReason) String() string {
	return [...]string{"", "cancel", "drain_timeout", "lease_lost"}[s]
}

// attempt is one claimed attempt while the daemon holds it.
type attempt struct {
	d         *Daemon
	claim     wire.Claim
	claimedAt time.Time // as persisted; kept when the report is added
	// claimedBoot is the claim on CLOCK_BOOTTIME, as persisted: the
	// execution timeout of a re-attached turn counts from it.
	claimedBoot boottime.Instant
	id          diagnostics.Attempt
	ref         wire.AttemptRef
	renewer     *heartbeat.Renewer
	// reporter sends the terminal report and fences the attempt (K1).
	reporter *settlement.Reporter
	// leases carries the newest acknowledged lease from the renewer to the
	// child's handover, which sends it as a DEADLINE frame (K5).
	leases chan handover.Lease

	// stopChild cancels the launch: before ACCEPT the only way to stop it.
	// Its cause (handover.StopCause) is the class the child's STOP carries.
	stopChild context.CancelCauseFunc
	// child is the turn child, started before the claim's record is flushed
	// and waiting for its payload (claimed), or childErr why it could not
	// be; launch hands it the payload.
	child    *handover.Prepared
	childErr error
	// heard is what watch has still to hear. One goroutine watches at a
	// time, so it needs no lock: a watcher of its own while the attempt's
	// goroutine blocks in the launch or the report (goWatch, which waits
	// for its end), the attempt's goroutine itself while the turn is held.
	heard watched
	// scope is the child's systemd scope, empty when it has none; set
	// inside Launch (placeTurn), on runAttempt's goroutine, which alone reads it.
	scope string

	// hostCancel is closed once the host's cancel poll brought the user's
	// cancel (cancels.go); the renewal answer is the other way (P7).
	hostCancel     chan struct{}
	hostCancelOnce sync.Once

	mu     sync.Mutex     // guards turn, reason and facts
	turn   *handover.Turn // set once the child accepted
	reason stopReason
	facts  settlement.Facts
}

func (a *attempt) echo() handover.Echo {
	return handover.Echo{AttemptID: a.claim.AttemptID, LeaseGeneration: a.claim.LeaseGeneration}
}

func (a *attempt) stop(r stopReason) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r == stopLease || a.reason == stopNone {
		a.reason = r
	}
	if r == stopLease {
		a.reporter.LeaseLost()
	}
}

// stopClass is the STOP frame's reason class the child sees for r; the
// turn child reports "cancelled" as a cancelled turn.
func (r stopReason) stopClass() string {
	switch r {
	case stopCancel:
		return turn.ClassCancelled
	case stopLease:
		return turn.StopLeaseLost
	case stopDrain:
		return turn.StopDrainTimeout
	}
	return turn.StopShutdown
}

// stopTurn stops the child: STOP with the reason's class once it has
// accepted, the launch's cancellation before. A recovered attempt whose
// child is not re-attached yet has neither: its wait (awaitReattach)
// stops the child itself.
func (a *attempt) stopTurn(r stopReason) {
	a.mu.Lock()
	t := a.turn
	a.mu.Unlock()
	switch {
	case t != nil:
		t.StopWith(r.stopClass())
	case a.stopChild != nil:
		a.stopChild(handover.StopCause{Class: r.stopClass()})
	}
}

func (a *attempt) stopReason() stopReason {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.reason
}

func (a *attempt) onProgress(body []byte) {
	var p turn.Progress
	if json.Unmarshal(body, &p) != nil {
		return // a progress record is advice; the RESULT or the lease decides
	}
	a.mu.Lock()
	a.facts = p.Facts
	a.mu.Unlock()
}

func (a *attempt) lastFacts() settlement.Facts {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.facts
}

// runAttempt is one attempt's life, from the claim to the forgotten state
// file. runCtx is Run's: its end is the handover.
//
// Its goroutine is the attempt's only one of the runner's while the turn
// is held: it waits in superviseTurn, watching the turn itself (watch), so
// a held turn costs the daemon one goroutine fewer. The
// work with large temporaries is in functions of their own (newAttempt,
// claimed, launch, turnOver): the frames left on the stack while the turn
// is held then fit the runtime's 4 KB stack instead of 8 KB.
func (d *Daemon) runAttempt(runCtx context.Context, claim *wire.Claim, sent time.Time) {
	a := d.newAttempt(claim)
	defer d.watchCancel(a)()
	if !d.claimed(a, sent) {
		return
	}
	defer d.m.holdLease(d.leaseLeft(a.renewer))()
	defer func() { a.renewer.Stop(); <-a.renewer.Done() }()

	// Until ACCEPT a stop of the child is the launch's cancellation.
	launchCtx, stopChild := context.WithCancelCause(context.Background())
	handedOver := false
	defer func() {
		if !handedOver { // a handed-over child is the next start's: it goes on
			stopChild(nil)
		}
	}()
	a.stopChild = stopChild
	unwatch := a.goWatch() // this goroutine blocks in Launch until the answer
	t, err := d.launch(launchCtx, a)
	if err != nil {
		d.notAccepted(runCtx, a, err) // watched still: the report waits on the lease
		unwatch()
		return
	}
	unwatch()
	handedOver = d.superviseTurn(runCtx, a, t)
}

func (d *Daemon) newAttempt(claim *wire.Claim) *attempt {
	a := &attempt{
		d:           d,
		claim:       *claim,
		claimedAt:   time.Now(),
		claimedBoot: boottime.Now(),
		id:          diagnostics.Attempt{JobID: claim.JobID, AttemptID: claim.AttemptID},
		ref:         wire.AttemptRef{AttemptID: claim.AttemptID, LeaseGeneration: claim.LeaseGeneration},
		leases:      make(chan handover.Lease, 1),
		hostCancel:  make(chan struct{}),
	}
	a.reporter = d.newReporter(a.claim)
	return a
}

// claimed persists the claim, records it and starts its renewer (steps
// 1–3). False: nothing was launched and nothing is renewed.
func (d *Daemon) claimed(a *attempt, sent time.Time) bool {
	// 0. The child: the spare, started before the claim, or
	// one started now, so that its exec and runtime start overlap the
	// flush below instead of following it. It has been given
	// nothing: whatever becomes of it before launch, it accepted nothing
	// (R33), and a daemon that dies now leaves no turn — the child sees
	// EOF and exits.
	a.child, a.childErr = d.takeChild(a)
	// 1. Persist before anything that can act on the claim: a restart must
	// find every lease we hold (P5). This is the launch's one flush — the
	// record's file and its directory (stateDir.save) — and the only one P5
	// needs before the child's ACCEPT: the payload goes over the
	// socketpair, not a file, and nothing else on the way to ACCEPT syncs.
	if err := d.state.save(record{Claim: a.claim, ClaimedAt: a.claimedAt, ClaimedBoot: a.claimedBoot}); err != nil {
		if a.child != nil {
			a.child.Close() // it never had the payload
		}
		// Nothing was launched and nothing is renewed: the lease runs out and
		// the reaper requeues the never-admitted job without counting it (P6).
		d.logErrClass(slog.LevelError, MsgPersistFailed, a.id, "persist", err)
		d.launchFailed(a.id, "not_launched", ClassStateUnwritable)
		return false
	}
	// 2. The claim record, 3. the renewer.
	d.rec.AttemptClaimed(context.Background(), a.id, a.claim.LeaseGeneration, d.workerID, d.cfg.HostName)
	d.startRenewer(a, heartbeat.AttemptFromClaim(a.claim, sent))
	return true
}

// startRenewer starts the attempt's renewer, whose verdict and cancel the
// attempt's watch hears along with the host's cancel poll and the drain.
func (d *Daemon) startRenewer(a *attempt, from heartbeat.Attempt) {
	a.renewer = heartbeat.Start(heartbeat.Config{Timings: d.cfg.Timings, Client: d.renew, Logger: d.log, Clock: d.cfg.Clock, OnRenewed: a.offerLease}, from)
	a.heard = watched{
		renewerDone: a.renewer.Done(), cancelled: a.renewer.CancelRequested(),
		hostCancelled: a.hostCancel, drained: d.stopTurns,
	}
}

// launch hands the child its payload and waits for its answer (step 4). The child
// gets the lease as it stands and the execution deadline, counted from now
// on CLOCK_BOOTTIME; the daemon's own timer counts from the same launch,
// ExecTimeoutMargin later (K6).
func (d *Daemon) launch(ctx context.Context, a *attempt) (*handover.Turn, error) {
	if a.childErr != nil {
		return nil, a.childErr // spawn failed: the claim may go back (R33)
	}
	lease := a.renewer.Lease()
	t, err := a.child.Launch(ctx, handover.Payload{
		Echo:         handover.Echo{AttemptID: a.claim.AttemptID, LeaseGeneration: a.claim.LeaseGeneration},
		Lease:        d.bootLease(lease),
		ExecDeadline: boottime.Now().Add(d.cfg.ExecTimeout),
		Data:         d.payload(a.claim),
	})
	if err != nil {
		return nil, err
	}
	sinceClaim := time.Since(a.claimedAt) // from the answer, not the long poll's start
	d.gate.success()
	d.refillSpare() // after ACCEPT: the next claim's child
	d.m.ClaimToAccept.Observe(sinceClaim.Seconds())
	d.logAttempt(slog.LevelInfo, MsgTurnAccepted, a.id, slog.Int("pid", t.PID()),
		slog.Float64("since_claim_ms", float64(sinceClaim.Microseconds())/1000), slog.String(keyScope, a.scope))
	return t, nil
}

// superviseTurn runs an accepted turn — launched by this daemon or
// re-attached at start — until its RESULT or its end, and reports it; or,
// when the handover comes first, leaves it running for the next start and
// returns true. The caller's goroutine watches a (watch) while the turn is
// held: no watcher of a's may be running when it is called.
func (d *Daemon) superviseTurn(runCtx context.Context, a *attempt, t *handover.Turn) (handedOver bool) {
	a.mu.Lock()
	a.turn = t
	a.mu.Unlock()
	// 5. Accepted: the turn runs until its RESULT or its end, watched by
	// this goroutine meanwhile.
	if a.watch(t.Done(), d.handingOver) { // runCtx ended: Run recorded the handover
		select {
		case <-t.Done(): // it ended meanwhile: report it as usual
		default:
			d.handOver(a, t)
			return true
		}
	}
	defer a.goWatch()() // the report waits on the lease
	d.turnOver(runCtx, a, t)
	return false
}

// turnOver reports an accepted turn that has ended.
func (d *Daemon) turnOver(runCtx context.Context, a *attempt, t *handover.Turn) {
	ended := t.Wait() // done: at once
	d.turnEnded(a, ended)
	if childSawLeaseRejected(ended) {
		// The child's own write was refused for the lease before the renewer
		// knew: its report must not be sent (R22, R23).
		a.stop(stopLease)
		d.logAttempt(slog.LevelWarn, MsgReportAbandoned, a.id, slog.String(keyDecision, "lease_rejected"))
	}
	if a.stopReason() == stopLease {
		d.forget(a, "lease_lost")
		return
	}
	rep, outcome := d.reportOf(a, ended)
	if class, failed := rep.Failed(); failed {
		// The positive record of the failure and its class, written before
		// the report is tried, so it stands whether or not the report gets
		// through (R18, R22).
		d.rec.TurnFailed(context.Background(), a.id, diagnostics.StageTurn, class)
	}
	d.finish(runCtx, a, rep, outcome)
}

// watched is what an attempt's watch has still to hear: each channel is
// nil once heard, every one once the renewer has ended.
type watched struct {
	renewerDone, cancelled, hostCancelled, drained <-chan struct{}
}

// watch stops the child when the lease is lost, the user cancels or the
// drain times out, whatever stage the attempt is in; a handover stops
// nothing. It returns when end or handingOver is closed, and says which.
// While a turn is held its goroutine waits here: what each stop does is
// in functions of their own, so that this frame stays small (runAttempt).
func (a *attempt) watch(end, handingOver <-chan struct{}) (handedOver bool) {
	w := &a.heard
	for {
		select {
		case <-w.renewerDone:
			a.renewerEnded()
		case <-w.cancelled:
			a.cancel(cancelViaRenewal)
		case <-w.hostCancelled:
			a.cancel(cancelViaHostPoll)
		case <-w.drained:
			a.drained()
		case <-end:
			return false
		case <-handingOver:
			return true
		}
	}
}

// renewerEnded stops the child unless the renewer was stopped: the lease
// is gone. After the renewer's end watch hears nothing more: the attempt
// is over or no longer ours.
func (a *attempt) renewerEnded() {
	a.heard = watched{}
	if a.renewer.Verdict().Outcome == heartbeat.Stopped {
		return
	}
	a.stop(stopLease)
	a.d.logAttempt(slog.LevelWarn, MsgTurnStopped, a.id, slog.String(keyOutcome, stopLease.String()))
	a.stopTurn(stopLease)
}

// cancel stops the child for the user's cancel, which came via; watch
// hears it once.
func (a *attempt) cancel(via string) {
	d := a.d
	a.heard.cancelled, a.heard.hostCancelled = nil, nil
	d.unwatchCancel(a.claim.AttemptID)
	a.stop(stopCancel)
	d.rec.TurnCancelled(context.Background(), a.id, diagnostics.CancelByUser)
	d.logAttempt(slog.LevelInfo, MsgCancelReceived, a.id, slog.String("via", via))
	a.stopTurn(stopCancel) // renewal goes on while the child stops (R13)
}

// drained stops the child at the drain's timeout or EndDrain; watch hears
// it once.
func (a *attempt) drained() {
	a.heard.drained = nil
	a.stop(stopDrain)
	a.d.rec.TurnCancelled(context.Background(), a.id, diagnostics.CancelByDrain)
	a.stopTurn(stopDrain)
}

// goWatch watches the attempt on a goroutine of its own, for the stages in
// which the attempt's goroutine blocks: the launch until ACCEPT, and the
// report. unwatch ends it and waits for its end.
func (a *attempt) goWatch() (unwatch func()) {
	over := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		a.watch(over, nil)
	}()
	return func() { close(over); <-ended }
}

// offerLease hands the renewer's newest lease to the handover, replacing
// one not yet taken: the child needs only the newest. The renewer calls it
// one renewal at a time, so it is the only sender; it never blocks.
func (a *attempt) offerLease(l heartbeat.Lease) {
	hl := a.d.bootLease(l)
	for {
		select {
		case a.leases <- hl:
			return
		default:
		}
		select {
		case <-a.leases:
		default:
		}
	}
}

// leaseLeft reports how long r's lease has left, on the daemon's Clock.
func (d *Daemon) leaseLeft(r *heartbeat.Renewer) func() time.Duration {
	return func() time.Duration { return r.Lease().Deadline.Sub(d.cfg.Clock.Now()) }
}

// bootLease is a renewer's lease on CLOCK_BOOTTIME, the clock of the turn
// child and the supervisor: the same instants when the daemon counts on
// CLOCK_BOOTTIME itself (production), moved over from its Clock otherwise.
func (d *Daemon) bootLease(l heartbeat.Lease) handover.Lease {
	if _, ok := d.cfg.Clock.(boottime.System); ok {
		return handover.Lease{Sent: l.Sent, Deadline: l.Deadline}
	}
	shift := boottime.Now().Sub(d.cfg.Clock.Now())
	return handover.Lease{Sent: l.Sent.Add(shift), Deadline: l.Deadline.Add(shift)}
}

func (d *Daemon) handoverConfig(a *attempt) handover.Config {
	return handover.Config{
		Path:             d.cfg.Executable,
		Args:             d.cfg.TurnArgs,
		Env:              d.cfg.ChildEnv,
		Stderr:           d.cfg.ChildStderr,
		ExecutionTimeout: d.cfg.ExecTimeout + d.cfg.ExecTimeoutMargin,
		StopGrace:        d.cfg.StopGrace,
		KillGrace:        d.cfg.KillGrace,
		Started:          d.placeTurn(a),
		OnProgress:       a.onProgress,
		OnResult:         a.keepResult,
		Leases:           a.leases,
		Reattach:         d.state.socket(a.claim.AttemptID),
	}
}

// keepResult persists the child's RESULT before the child is told the
// daemon has it (KEPT): from then on only this record holds it (P5).
func (a *attempt) keepResult(body []byte) {
	if err := a.d.state.save(record{Claim: a.claim, ClaimedAt: a.claimedAt, ClaimedBoot: a.claimedBoot, Result: body}); err != nil {
		a.d.logErrClass(slog.LevelError, MsgPersistFailed, a.id, "persist_result", err)
	}
}

// payload is the turn child's payload (runner/turn's contract). It holds
// the worker token: it goes only over the descriptor.
func (d *Daemon) payload(c wire.Claim) []byte {
	p := turn.Payload{
		Claim:           c,
		ControlPlaneURL: d.cfg.ControlPlaneURL,
		TLS:             d.cfg.TLS,
		Sandbox: turn.Sandbox{
			Backend:  d.cfg.Sandbox,
			StateDir: d.cfg.StateDir,
			HostName: d.cfg.HostName,
			Runnerd:  d.cfg.Executable,
			Docker:   d.cfg.Docker,
		},
		RequestTimeoutMS:    d.cfg.Receipts.TryTimeout.Milliseconds(),
		RetryDelayMS:        d.cfg.Receipts.Wait.Milliseconds(),
		LogFormat:           d.cfg.LogFormat,
		PermissionTimeoutMS: d.cfg.PermissionTimeout.Milliseconds(),
	}
	b, _ := json.Marshal(p) // plain data: cannot fail
	return b
}

// notAccepted handles a child that did not take its turn. Proof that it
// never accepted releases the claim (R33) and counts a launch failure
// (R37) unless the conversation itself is at fault (S4); anything else is
// no proof (R34) and is reported failed.
func (d *Daemon) notAccepted(runCtx context.Context, a *attempt, err error) {
	var na *handover.NotAccepted
	if !errors.As(err, &na) {
		na = &handover.NotAccepted{Outcome: handover.OutcomeUnconfirmed, Class: handover.ClassProtocol, Err: err}
	}
	why := a.stopReason()
	if why == stopLease {
		d.forget(a, "lease_lost")
		return
	}
	rel, releasable := na.Release()
	switch {
	case why != stopNone:
	case na.Outcome == handover.OutcomeDeclined && sandbox.ConversationFault(na.Class):
		// S4: the conversation's own fault (its image, its agent command):
		// released, so the control plane's release cap (K7) ends that job,
		// while this host stays healthy for every other conversation.
		d.m.Declines.WithLabelValues(na.Class).Inc()
		d.logAttempt(slog.LevelWarn, MsgConversationFault, a.id, slog.String(diagnostics.KeyClass, na.Class))
	default:
		class := na.Class
		if releasable {
			class = rel.Class() // declined:<class> says more beside the host
		}
		d.launchFailed(a.id, na.Outcome.String(), class)
	}
	if releasable {
		req := wire.ReleaseRequest{AttemptRef: a.ref, Class: rel.Class()}
		d.finish(runCtx, a, settlement.Report{Release: &req}, "released")
		return
	}
	outcome, class := wire.OutcomeFailed, na.Class
	cause, evidence := wire.CauseUnknown, "the turn child never accepted: "+na.Outcome.String()+" "+na.Class
	switch why {
	case stopCancel:
		outcome, cause, evidence = wire.OutcomeCancelled, wire.CauseCancelled, "the user's cancel before the turn child accepted"
	case stopDrain:
		outcome, class = wire.OutcomeWorkerLost, ClassHostStopped
		cause, evidence = wire.CauseHostLost, "the host daemon's drain or shutdown before the turn child accepted"
	}
	rep := settlement.Facts{}.Report(a.ref, settlement.Result{Outcome: outcome, Class: class, Reason: "the turn child never accepted",
		Cause: cause, CauseEvidence: evidence})
	d.finish(runCtx, a, rep, outcome)
}

// launchFailed counts a launch failure and pauses claiming past the threshold.
func (d *Daemon) launchFailed(id diagnostics.Attempt, outcome, class string) {
	pause := d.gate.failure(class, time.Now())
	d.m.launchFailed(outcome, class)
	le := d.gate.report()
	n := 0
	if le != nil {
		n = le.Consecutive
	}
	d.logLaunchFailed(id, outcome, class, n, pause)
}

func (d *Daemon) turnEnded(a *attempt, e handover.Ended) {
	sig := ""
	if e.Signal != 0 {
		sig = e.Signal.String()
	}
	d.logAttempt(slog.LevelInfo, MsgTurnEnded, a.id,
		slog.String(keyOutcome, e.Outcome.String()), slog.Int(diagnostics.KeyExitCode, e.ExitCode),
		slog.String(diagnostics.KeySignal, sig), slog.Bool(keyStopped, e.Stopped), slog.Bool(keyTimedOut, e.TimedOut))
	if e.TimedOut {
		d.rec.ExecutionTimeout(context.Background(), a.id, d.cfg.ExecTimeout+d.cfg.ExecTimeoutMargin)
	}
	var res turn.Result
	if e.Outcome == handover.OutcomeResult && json.Unmarshal(e.Result, &res) == nil {
		d.m.imagePull(res.ImagePull)
	}
}

// reportOf is the terminal report of an accepted turn: the child's own from
// its RESULT, or one built from its last PROGRESS facts.
func (d *Daemon) reportOf(a *attempt, e handover.Ended) (settlement.Report, string) {
	if e.Outcome == handover.OutcomeResult {
		var res turn.Result
		// The child reports a finish or an abandon, never a release.
		if err := json.Unmarshal(e.Result, &res); err == nil && res.Report.Valid(a.ref) && res.Report.Release == nil {
			outcome := res.Outcome
			if res.Report.Abandon != nil {
				outcome = "abandoned"
			}
			return res.Report, outcome
		}
		e.Outcome = handover.OutcomeExitedWithoutResult
		e.Err = errors.New("unreadable RESULT")
	}
	class := ClassChildExited
	switch {
	case e.TimedOut:
		class = ClassExecutionTimeout
	case e.Err != nil:
		class = ClassBadResult
	case e.Outcome == handover.OutcomeKilled:
		class = ClassKilled
	}
	outcome := wire.OutcomeFailed
	reason := "the turn child ended without a result"
	cause, evidence := wire.CauseUnknown, fmt.Sprintf("the turn child ended without a result (%s, exit code %d)", e.Outcome, e.ExitCode)
	if e.TimedOut {
		cause, evidence = wire.CauseExecTimeout, "the daemon's execution deadline passed and it ended the turn child"
	}
	switch a.stopReason() {
	case stopCancel:
		outcome, reason = wire.OutcomeCancelled, "cancelled by the user"
		cause, evidence = wire.CauseCancelled, "the user's cancel; the turn child ended without a result"
	case stopDrain:
		// The host, not the turn, ended it: a never-admitted job runs again
		// without counting an attempt (P6); an admitted one is LOST.
		outcome, class, reason = wire.OutcomeWorkerLost, ClassHostStopped, "stopped by the host daemon's shutdown"
		cause, evidence = wire.CauseHostLost, "the host daemon's drain or shutdown ended the turn child"
	}
	rep := a.lastFacts().Report(a.ref, settlement.Result{Outcome: outcome, Class: class, Reason: reason, Cause: cause, CauseEvidence: evidence})
	if rep.Abandon != nil {
		outcome = "abandoned"
	}
	return rep, outcome
}

// childSawLeaseRejected: the child's RESULT says the lease is gone — one of
// its own writes was refused for it, or its own lease deadline passed.
func childSawLeaseRejected(e handover.Ended) bool {
	var res turn.Result
	return e.Outcome == handover.OutcomeResult && json.Unmarshal(e.Result, &res) == nil && res.LeaseRejected
}
