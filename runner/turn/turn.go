package turn

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/handover"
	"github.com/runnerd/runnerd/internal/boottime"
	"github.com/runnerd/runnerd/internal/failover"
	"github.com/runnerd/runnerd/internal/retry"
	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/settlement"
	"github.com/runnerd/runnerd/wire"
)

// Defaults of the Payload's zero fields.
const (
	// The receipt policy's (R24), defined in settlement.
	DefaultRequestTimeout = settlement.DefaultTryTimeout
	DefaultRetryDelay     = settlement.DefaultWait
	// supervisorCallTimeout bounds one lease deadline sent to the supervisor.
	supervisorCallTimeout = 5 * time.Second
	// InterruptGrace is how long the agent has to stop on SIGINT after the
	// user's cancel before the supervisor kills it (K10). With the
	// settlement after it, it fits within the daemon's stop grace.
	InterruptGrace = 3 * time.Second
)

// Classes of the turn's own failures, for the terminal report and DECLINE.
const (
	ClassBadPayload         = "bad_payload"
	ClassSandboxConfig      = "sandbox_config"
	ClassTLSConfig          = "tls_config" // the payload's TLS files cannot be used (gone or changed since the daemon read them)
	ClassSandboxUnavailable = "sandbox_unavailable"
	ClassActivation         = "activation_failed"
	ClassBoundaryMismatch   = "native_boundary_mismatch"
	ClassContainerReplaced  = "container_replaced"        // K13: not the exact retained container
	ClassReceiptMismatch    = "retained_receipt_mismatch" // K13: the supervisor retains no record of the interrupted activation
	ClassWorkspaceLost      = "workspace_lost"
	ClassImageUnavailable   = sandbox.ClassImageUnavailable // the sandbox's image could not be had (S4: the conversation's)
	ClassContainerRecord    = "container_record_failed"
	ClassAdmissionRefused   = "admission_refused"
	ClassAgentStart         = "agent_start_failed"
	ClassAgentInterrupted   = "agent_interrupted"
	ClassExecTimeout        = "execution_timeout"
	ClassAgentExit          = "agent_exit"
	ClassAgentSignal        = "agent_signal" // agent_signal_KILL: a signal ended the agent
	ClassSettlement         = "settlement_failed"
	ClassCancelled          = "cancelled"
	ClassHostStopped        = "host_stopped" // the daemon's drain or shutdown ended the turn (P6)
	// An ACP conversation's agent before admission: it did not answer
	// initialize or its session call (the conversation stays usable), or
	// its kept session cannot be loaded into a new process (A6: the
	// conversation is unrecoverable, never silently on a new session).
	ClassAgentUnresponsive = "agent_unresponsive"
	ClassACPNotLoadable    = "acp_session_not_loadable"
)

// EventStopReason is the event an ACP turn ends with: the agent's stop
// reason (end_turn, max_tokens, max_turn_requests, refusal, cancelled).
const EventStopReason = "stop_reason"

// STOP reason classes the daemon sends after ACCEPT, beside ClassCancelled
// and handover.ClassExecutionTimeout.
const (
	StopLeaseLost    = "lease_lost"    // the lease is gone: write nothing more
	StopDrainTimeout = "drain_timeout" // the daemon's drain ran out
	StopShutdown     = "shutdown"      // the daemon stops hard
)

// Main is `runnerd turn`: it takes the handover descriptor, runs the turn
// and returns the process's exit code. Records go to stderr. open builds
// the payload's sandbox backend from the backends the executable links.
func Main(ctx context.Context, stderr io.Writer, open Opener) int {
	ch, err := handover.OpenFromEnv()
	if err != nil {
		fmt.Fprintf(stderr, "runnerd turn: %v\n", err)
		return 2
	}
	defer ch.Close()
	// The turn ends on STOP or the parent's death (ch.Context; its cause says
	// which), on SIGTERM (ctx), which the daemon sends when a STOP was not
	// heeded within its grace, and when the lease or the execution deadline
	// passes (ch.Deadlines, K5, K6).
	turnCtx, cancel := context.WithCancelCause(ch.Context())
	defer cancel(nil)
	defer context.AfterFunc(ctx, func() { cancel(errSignalled) })()
	defer context.AfterFunc(ch.Deadlines(), func() { cancel(context.Cause(ch.Deadlines())) })()

	var p Payload
	if err := json.Unmarshal(ch.Payload().Data, &p); err != nil || p.Claim.AttemptID != ch.Payload().AttemptID {
		fmt.Fprintln(stderr, "runnerd turn: the payload is not a turn for this attempt")
		_ = ch.Decline(ClassBadPayload)
		return 2
	}
	log := newLogger(p.LogFormat, stderr).With("job_id", p.Claim.JobID, "attempt_id", p.Claim.AttemptID)

	// The daemon read these files at its start; one gone or spoilt since
	// is a decline that names it, never a call without the trust.
	tlsConfig, err := p.TLS.Config()
	if err != nil {
		log.Error(diagnostics.MsgTurnDeclined, "class", ClassTLSConfig, "reason", err.Error())
		_ = ch.Decline(ClassTLSConfig)
		return 1
	}
	// The daemon's list of replicas; this child keeps its own view of
	// which one answers.
	endpoints, err := failover.Parse(p.ControlPlaneURL)
	if err != nil {
		log.Error(diagnostics.MsgTurnDeclined, "class", ClassBadPayload)
		_ = ch.Decline(ClassBadPayload)
		return 2
	}
	backend, err := open(p.Sandbox, log)
	if err != nil {
		log.Error(diagnostics.MsgTurnDeclined, "class", ClassSandboxConfig, "error_class", diagnostics.Class(err))
		_ = ch.Decline(ClassSandboxConfig)
		return 1
	}
	spec := sandbox.SpecFromClaim(p.Claim)
	// A preflight that a stop or a deadline cut short proves nothing about
	// the sandbox: the child takes the turn and ends it as that stop says,
	// never a decline (K6, R34).
	if class := preflight(turnCtx, backend, spec); class != "" && turnCtx.Err() == nil {
		log.Warn(diagnostics.MsgTurnDeclined, "class", class)
		_ = ch.Decline(class)
		return 0
	}
	if err := ch.Accept(); err != nil {
		// The parent is gone or refused the echo: it never saw an ACCEPT,
		// so it may release the claim; nothing was done.
		log.Error(diagnostics.MsgAcceptFailed, "error_class", diagnostics.Class(err))
		return 1
	}

	t := &turn{p: p, ch: ch, log: log, backend: backend, spec: spec, tls: tlsConfig, endpoints: endpoints}
	res := t.run(turnCtx)
	body, err := json.Marshal(res)
	if err == nil {
		err = ch.Result(body)
	}
	if err != nil {
		log.Error(diagnostics.MsgResultUndelivered, "error_class", diagnostics.Class(err))
		return 1
	}
	return 0
}

// preflight is the read-only check before ACCEPT; "" means go ahead. It
// looks at the sandbox, never at the prompt (K12).
func preflight(ctx context.Context, b sandbox.Backend, spec sandbox.Spec) string {
	if err := b.Preflight(ctx, spec); err != nil {
		var pe *sandbox.PreflightError
		if errors.As(err, &pe) && pe.Class != "" {
			return pe.Class
		}
		return "preflight_failed"
	}
	return ""
}

// turn is one accepted turn in the child.
type turn struct {
	p       Payload
	ch      *handover.Child
	log     *slog.Logger
	backend sandbox.Backend
	spec    sandbox.Spec
	tls     *tls.Config // the control plane's TLS, as the daemon's (nil: Go's defaults)
	// endpoints is the payload's control-plane addresses (one or several).
	endpoints *failover.Endpoints
	sess      *settlement.Session
	fence     context.Context // ends when the lease is gone (run)
	stage     Stage           // the last progress stage, for records
	pull      *ImagePull      // the image pull Ensure made or failed, for the RESULT
	// agentCause and agentEvidence are how the agent ended as its
	// supervisor told it (S5), once the turn's result is in.
	agentCause    wire.Cause
	agentEvidence string
}

// run drives the turn after ACCEPT (architecture steps 4–7) and returns the
// RESULT. ctx ends when the parent sends STOP or dies.
func (t *turn) run(ctx context.Context) Result {
	c := t.p.Claim
	ref := wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}
	sess, err := settlement.New(settlement.Config{
		BaseURL: t.endpoints.Base(),
		Transport: t.endpoints.Transport(&http.Transport{Proxy: http.ProxyFromEnvironment, TLSClientConfig: t.tls,
			ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 4, IdleConnTimeout: 90 * time.Second}),
		WorkerToken: c.WorkerToken,
		JobID:       c.JobID,
		Attempt:     ref,
		Prompt:      c.Turn.Prompt,
		Logger:      t.log,
		Receipts: retry.Policy{
			TryTimeout: ms(t.p.RequestTimeoutMS, DefaultRequestTimeout),
			Wait:       ms(t.p.RetryDelayMS, DefaultRetryDelay),
		},
		Reports: retry.Policy{
			TryTimeout: ms(t.p.RequestTimeoutMS, DefaultRequestTimeout),
			Wait:       ms(t.p.RetryDelayMS, DefaultRetryDelay),
		},
		LeaseTTL: ms(c.LeaseTTLMS, settlement.DefaultLeaseTTL),
	})
	if err != nil {
		// Only a malformed payload gets here; without a session nothing can
		// be reported but by the daemon.
		return result(settlement.Facts{}, ref, wire.OutcomeFailed, ClassBadPayload)
	}
	t.sess = sess
	// Close's only error is ErrEventsDropped, which the Session has already
	// recorded (agent_events_dropped): the turn's outcome does not change.
	defer sess.Close()
	// The fence ends the turn at once, in every phase and past the user's
	// cancel too: the child's own lease deadline passed, or one of its own
	// writes was refused for the lease (409/401/403/404) — the agent stops
	// now, not at the daemon's next STOP (K5).
	fence, endFence := context.WithCancelCause(context.Background())
	defer endFence(nil)
	defer context.AfterFunc(t.ch.Deadlines(), func() {
		if errors.Is(context.Cause(t.ch.Deadlines()), handover.ErrLeaseExpired) {
			endFence(handover.ErrLeaseExpired)
		}
	})()
	defer context.AfterFunc(sess.Fence(), func() { endFence(settlement.ErrLeaseRejected) })()
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	defer context.AfterFunc(fence, func() { stop(context.Cause(fence)) })()
	t.fence = fence
	defer fenceOnLeaseLoss(ctx, sess)()

	outcome, class := t.drive(ctx)
	outcome, class = byStop(ctx, outcome, class)
	if class == ClassExecTimeout {
		// R18, K6: the positive record, naming the phase it struck in.
		t.log.Warn(diagnostics.MsgExecutionTimeout, diagnostics.KeyStage, string(t.stage))
	}
	// Asked of the sources, not of fence: its AfterFuncs may not have run yet.
	expired := errors.Is(context.Cause(t.ch.Deadlines()), handover.ErrLeaseExpired)
	leaseGone := stoppedForLeaseLoss(ctx) || expired || sess.Rejected()
	if leaseGone {
		sess.LeaseLost() // before the flush, whether or not the watcher ran yet
		if expired {
			// K5: the positive record that the child fenced itself (R18);
			// the deadline is a CLOCK_BOOTTIME instant in nanoseconds.
			dl := t.ch.Lease().Deadline
			t.log.Warn(diagnostics.MsgTurnLeaseDeadline, "lease_deadline_ns", int64(dl),
				"agent_stopped_after_ms", boottime.Now().Sub(dl).Milliseconds())
		}
	}
	sess.FlushEvents(context.WithoutCancel(ctx))
	res := result(sess.Facts(), ref, outcome, class)
	res.LeaseRejected = sess.Rejected() || leaseGone
	res.ImagePull = t.pull
	if f := res.Report.Finish; f != nil && f.Outcome != wire.OutcomeSucceeded {
		f.Cause, f.CauseEvidence = t.cause(ctx, f.Outcome, f.Class, leaseGone, expired)
		if len(f.CauseEvidence) > wire.MaxCauseEvidenceBytes {
			f.CauseEvidence = strings.ToValidUTF8(f.CauseEvidence[:wire.MaxCauseEvidenceBytes], "")
		}
	}
	return res
}

// cause names why the turn ended as it did (S5), from the stop that ended
// it, if one did, else from how its agent ended.
func (t *turn) cause(ctx context.Context, outcome, class string, leaseGone, expired bool) (wire.Cause, string) {
	var se *handover.StopError
	stopped := errors.As(context.Cause(ctx), &se)
	switch {
	case leaseGone && expired:
		return wire.CauseLeaseFenced, "the lease deadline passed in the turn child (K5) at stage " + string(t.stage)
	case leaseGone && t.sess.Rejected():
		return wire.CauseLeaseFenced, "the control plane refused a write of the attempt for its lease at stage " + string(t.stage)
	case leaseGone:
		return wire.CauseLeaseFenced, "the daemon's STOP lease_lost at stage " + string(t.stage)
	case class == ClassExecTimeout:
		return wire.CauseExecTimeout, "the execution deadline passed at stage " + string(t.stage)
	case outcome == wire.OutcomeCancelled:
		return wire.CauseCancelled, "the user's cancel at stage " + string(t.stage)
	case class == ClassHostStopped && stopped:
		return wire.CauseHostLost, "the daemon's STOP " + se.Class + " at stage " + string(t.stage)
	case t.agentCause != "":
		return t.agentCause, t.agentEvidence
	}
	return wire.CauseUnknown, "the turn failed with class " + class + " at stage " + string(t.stage)
}

// byStop: a turn that failed because it was stopped ends as the stop says:
// execution_timeout when the execution deadline passed — the child's own or
// the daemon's STOP — in whatever phase (K6); cancelled for the user's
// cancel (P7); worker_lost for the daemon's drain timeout or shutdown, so
// a never-admitted job runs again without counting an attempt and an
// admitted one is LOST (P6, R30). A turn that did not fail keeps its outcome.
func byStop(ctx context.Context, outcome, class string) (string, string) {
	if class == "" {
		return outcome, class
	}
	cause := context.Cause(ctx)
	if errors.Is(cause, handover.ErrExecutionDeadline) {
		return wire.OutcomeFailed, ClassExecTimeout
	}
	var se *handover.StopError
	if !errors.As(cause, &se) {
		return outcome, class
	}
	switch se.Class {
	case handover.ClassExecutionTimeout:
		return wire.OutcomeFailed, ClassExecTimeout
	case ClassCancelled:
		return wire.OutcomeCancelled, ClassCancelled
	case StopDrainTimeout, StopShutdown:
		return wire.OutcomeWorkerLost, ClassHostStopped
	}
	return outcome, class
}

// ignoringCancel is ctx without the daemon's STOP "cancelled": it ends
// when ctx ends for any other cause (a lease loss, a drain timeout, a
// shutdown, the daemon gone), and when deadlines (the execution deadline)
// or fence ends, which may come after the cancel. The returned func
// releases it.
func ignoringCancel(ctx, deadlines, fence context.Context) (context.Context, func()) {
	out, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		var se *handover.StopError
		if cause := context.Cause(ctx); !errors.As(cause, &se) || se.Class != ClassCancelled {
			cancel(cause)
		}
	})
	stopDeadlines := context.AfterFunc(deadlines, func() { cancel(context.Cause(deadlines)) })
	stopFence := context.AfterFunc(fence, func() { cancel(context.Cause(fence)) })
	return out, func() { stop(); stopDeadlines(); stopFence(); cancel(nil) }
}

// fenceOnLeaseLoss fences sess as soon as ctx ends with the daemon's STOP
// "lease_lost": the event uploader and the final flush then write nothing
// more about the attempt (R8, R10, R11), as the daemon itself does not.
// The returned func stops watching.
func fenceOnLeaseLoss(ctx context.Context, sess *settlement.Session) func() bool {
	return context.AfterFunc(ctx, func() {
		if stoppedForLeaseLoss(ctx) {
			sess.LeaseLost()
		}
	})
}

// stoppedForLeaseLoss: ctx ended with the daemon's STOP "lease_lost".
func stoppedForLeaseLoss(ctx context.Context) bool {
	var se *handover.StopError
	return errors.As(context.Cause(ctx), &se) && se.Class == StopLeaseLost
}

func result(f settlement.Facts, ref wire.AttemptRef, outcome, class string) Result {
	rep := f.Report(ref, settlement.Result{Outcome: outcome, Class: class})
	if rep.Finish != nil && (class == ClassBoundaryMismatch || class == ClassWorkspaceLost || class == ClassContainerReplaced || class == ClassReceiptMismatch ||
		class == ClassACPNotLoadable) {
		// R31: the retained session is provably not the settled one; the
		// conversation cannot continue, so say so rather than fail every
		// later turn the same way.
		rep.Finish.Unrecoverable = true
	}
	out, cls := outcome, class
	if rep.Finish != nil {
		out, cls = rep.Finish.Outcome, rep.Finish.Class
	} else if rep.Abandon != nil {
		cls = rep.Abandon.Class
	}
	return Result{Report: rep, Outcome: out, Class: cls}
}

// drive runs the turn's steps and returns its outcome and, for a failure,
// its class.
func (t *turn) drive(ctx context.Context) (outcome, class string) {
	fail := func(class string) (string, string) { return wire.OutcomeFailed, class }
	t.progress(StageAccepted)
	if ctx.Err() != nil {
		// Stopped before it began (a preflight cut short): byStop names it.
		return fail(ClassAgentInterrupted)
	}

	ensureStart := time.Now()
	sb, err := t.backend.Ensure(ctx, t.spec)
	if err != nil && errors.Is(err, sandbox.ErrImageUnavailable) && ctx.Err() == nil {
		// S4: the conversation's image, not the host: the turn fails before
		// admission, the conversation stays usable. The reason (the
		// engine's, no secret of ours) goes on the job's timeline.
		took := time.Since(ensureStart)
		t.pull = &ImagePull{DurationMS: took.Milliseconds(), Failed: true}
		t.log.Warn(diagnostics.MsgImageUnavailable, "image", t.spec.Image)
		t.event(wire.EventImagePullFailed, map[string]any{"image": t.spec.Image, "duration_ms": took.Milliseconds(), "reason": truncate(err.Error(), 512)})
		return fail(ClassImageUnavailable)
	}
	if err != nil {
		t.log.Error(diagnostics.MsgSandboxUnavailable, "error_class", diagnostics.Class(err))
		if errors.Is(err, sandbox.ErrWorkspaceLost) {
			return fail(ClassWorkspaceLost)
		}
		return fail(ClassSandboxUnavailable)
	}
	if p := sb.Pulled; p != nil {
		t.pull = &ImagePull{DurationMS: p.Duration.Milliseconds()}
		t.event(wire.EventImagePulled, map[string]any{"image": p.Image, "duration_ms": p.Duration.Milliseconds()})
	}
	cl := sb.Client()
	if sb.Version < sandbox.ProtocolVersion {
		// The backend could not replace it (busy, or not its binary): no
		// lease deadline at the supervisor (the child still stops the
		// agent at it, K5), no interrupt (a cancel fails closed), no
		// retained record (a quarantined conversation waits: verify).
		t.log.Warn(diagnostics.MsgSupervisorOutdated, "version", sb.Version, "want_version", sandbox.ProtocolVersion)
	}
	// The supervisor gets the lease deadline now and after every renewal,
	// so that even a dead or frozen turn child leaves no agent running past
	// it (K5).
	act, err := cl.Activate(ctx, t.ch.Lease().Deadline)
	if err != nil {
		t.log.Error(diagnostics.MsgActivationFailed, "error_class", sandbox.CodeOf(err))
		return fail(ClassActivation)
	}
	if sb.Version >= sandbox.Version2 {
		defer t.forwardLeases(cl, act.ID)()
	}
	// The activation fenced every older token of the supervisor, the
	// interrupted turn's included (K13), so nothing of it runs any more.
	if class := t.verify(sb, act); class != "" {
		return fail(class)
	}
	acpTurn := t.p.Claim.Turn.AgentProtocol == wire.AgentProtocolACP
	if acpTurn {
		// The agent is started, initialized and its session created or
		// loaded before admission, and before the container is recorded:
		// an agent that cannot get that far fails the turn with no prompt
		// sent, and a session that cannot be loaded is reported
		// unrecoverable (as a boundary mismatch is).
		if sb.Version < sandbox.Version3 {
			t.log.Error(diagnostics.MsgSandboxUnavailable, "error_class", "supervisor_outdated", "version", sb.Version)
			return fail(ClassSandboxUnavailable)
		}
		if _, err := cl.Prepare(ctx, act.ID, t.spec.AgentCommand); err != nil {
			t.progress("agent_prepare_failed")
			t.log.Warn(diagnostics.MsgAgentPrepareFailed, "error_class", sandbox.CodeOf(err))
			switch {
			case errors.Is(err, sandbox.ErrAgentUnresponsive):
				return fail(ClassAgentUnresponsive)
			case errors.Is(err, sandbox.ErrSessionNotLoadable):
				return fail(ClassACPNotLoadable)
			case errors.Is(err, sandbox.ErrStartFailed):
				return fail(ClassAgentStart)
			}
			return fail(ClassSandboxUnavailable)
		}
		t.progress("agent_prepared")
	}
	record := func() error { return t.sess.RecordContainer(ctx, sb.Backend, sb.ID) }
	if t.p.Claim.Turn.Quarantined {
		record = func() error { return t.sess.ResumeContainer(ctx, sb.Backend, sb.ID, act.NativeTurn) }
	}
	if err := record(); err != nil {
		return fail(ClassContainerRecord)
	}
	if t.p.Claim.Turn.Quarantined {
		t.log.Info(diagnostics.MsgConversationResumed, "native_turn", act.NativeTurn,
			"settled_native_turn", t.p.Claim.Turn.NativeTurn,
			"unrecorded", act.Previous != nil && act.Previous.Unrecorded)
	}
	t.progress(StageContainerRecorded)

	adm, err := t.sess.Admit(ctx, act.ID)
	if err != nil {
		// Ambiguous or refused: the prompt is never sent (R25, R30); the
		// Facts say which, and the report follows from them.
		t.progress(StageAdmissionFailed)
		if errors.Is(err, settlement.ErrAmbiguousAdmission) {
			return fail(settlement.ClassAdmissionAmbiguous)
		}
		return fail(ClassAdmissionRefused)
	}
	t.progress(StageAdmitted)

	// The driving connection does not end on the user's cancel: the cancel
	// interrupts the agent at the supervisor instead, which settles an
	// interrupted boundary (K10). Every other stop still drops it.
	runCtx, endRun := ignoringCancel(ctx, t.ch.Deadlines(), t.fence)
	defer endRun()
	runCtx, dropRun := context.WithCancel(runCtx)
	defer dropRun()
	stream, err := settlement.SendPrompt(runCtx, adm, func(ctx context.Context, prompt string) (*sandbox.Turn, error) {
		if acpTurn {
			return cl.RunACP(ctx, act.ID, prompt, sandbox.ACPOptions{PermissionPolicy: t.p.Claim.Turn.PermissionPolicy,
				PermissionTimeout: time.Duration(t.p.PermissionTimeoutMS) * time.Millisecond})
		}
		return cl.Run(ctx, act.ID, t.spec.AgentCommand, prompt)
	})
	if err != nil {
		t.progress(StagePromptFailed)
		if errors.Is(err, sandbox.ErrStartFailed) {
			return fail(ClassAgentStart)
		}
		return fail(ClassAgentInterrupted)
	}
	t.progress(StagePromptSent)
	defer stream.Close()
	intr := t.interruptOnCancel(ctx, runCtx, cl, act.ID, dropRun)
	defer intr.wait()
	perms := t.watchPermissions(runCtx, stream)
	for {
		ev, err := stream.Next()
		if err != nil {
			break
		}
		t.sess.Event(ev.Type, ev.Data)
		perms.saw(ev)
	}
	perms.stop()
	res, err := stream.Result()
	if err != nil && intr.wait() {
		// K10: interrupted at the user's request, and the supervisor
		// settled an interrupted boundary: settle it with the control
		// plane, and the conversation continues from it. If it cannot be
		// settled, the turn fails closed as any unsettled admitted turn.
		settleCtx, stopSettle := ignoringCancel(ctx, t.ch.Deadlines(), t.fence)
		defer stopSettle()
		if _, err := t.sess.Settle(settleCtx, adm, func(ctx context.Context) (wire.SupervisorReceipt, error) {
			return cl.Settle(ctx, act.ID)
		}); err != nil {
			return fail(ClassSettlement)
		}
		t.progress(StageSettledInterrupted)
		return wire.OutcomeCancelled, ClassCancelled
	}
	if err != nil {
		// Asked of the source as well: the driving connection also ends
		// on the deadline directly (runCtx), maybe before ctx has.
		if errors.Is(context.Cause(ctx), handover.ErrExecutionDeadline) ||
			errors.Is(context.Cause(t.ch.Deadlines()), handover.ErrExecutionDeadline) {
			return fail(ClassExecTimeout)
		}
		t.log.Warn(diagnostics.MsgTurnInterrupted, "error_class", sandbox.CodeOf(err))
		return fail(ClassAgentInterrupted)
	}
	t.agentCause, t.agentEvidence = agentCause(res)
	t.log.Info(diagnostics.MsgAgentExit, diagnostics.KeyExitCode, res.ExitCode, diagnostics.KeySignal, res.Signal, "native_turn", res.NativeTurn,
		"cause", string(t.agentCause))
	t.progress(StageAgentExited)
	if res.StopReason != "" {
		// How an ACP agent ended its turn, on the job page among its events.
		b, _ := json.Marshal(map[string]string{"stop_reason": res.StopReason})
		t.sess.Event(EventStopReason, b)
	}

	// The agent's turn is over: settle it even if the user's cancel arrives
	// now, or a completed turn would fail closed and lose its conversation
	// (R13, R28). Any other STOP still ends settlement.
	settleCtx, stopSettle := ignoringCancel(ctx, t.ch.Deadlines(), t.fence)
	defer stopSettle()
	if _, err := t.sess.Settle(settleCtx, adm, func(ctx context.Context) (wire.SupervisorReceipt, error) {
		return cl.Settle(ctx, act.ID)
	}); err != nil {
		return fail(ClassSettlement)
	}
	t.progress(StageSettled)
	// R23: a failed notice is recorded by the session and does not fail the turn.
	_ = t.sess.Notify(settleCtx)
	if class := exitClass(res); class != "" {
		return fail(class)
	}
	return wire.OutcomeSucceeded, ""
}

// interruption is the interrupt of a running turn on the user's cancel.
type interruption struct {
	stop func() bool   // stops watching for the cancel
	done chan struct{} // closed once the watch, started, ended
	ok   bool          // the supervisor answered with a receipt; set before done closes

	once  sync.Once
	never bool // the watch was stopped before the cancel came; set in once
}

// interruptOnCancel asks the supervisor to interrupt the activation's
// turn once ctx ends with the daemon's STOP "cancelled" (K10): SIGINT,
// SIGKILL after InterruptGrace, and an interrupted boundary with its
// receipt. Within runCtx, which the cancel does not end. If the supervisor
// does not answer with a receipt, drop ends the driving connection, so the
// agent is stopped all the same — with no receipt, and the turn fails
// closed.
func (t *turn) interruptOnCancel(ctx, runCtx context.Context, cl *sandbox.Client, activationID string, drop func()) *interruption {
	in := &interruption{done: make(chan struct{})}
	in.stop = context.AfterFunc(ctx, func() {
		defer close(in.done)
		if !userCancelled(ctx) {
			return
		}
		start := time.Now()
		ictx, cancel := context.WithTimeout(runCtx, InterruptGrace+supervisorCallTimeout)
		rcpt, err := cl.Interrupt(ictx, activationID, InterruptGrace)
		cancel()
		if err != nil {
			t.log.Warn(diagnostics.MsgTurnInterruptFailed, "error_class", sandbox.CodeOf(err))
			drop()
			return
		}
		in.ok = true
		t.log.Info(diagnostics.MsgTurnInterruptedOnCancel, "native_turn", rcpt.NativeTurn,
			"interrupted", rcpt.Interrupted, "took_ms", time.Since(start).Milliseconds())
	})
	return in
}

// wait reports whether an interrupt was asked for and got its receipt,
// waiting for it to end.
func (in *interruption) wait() bool {
	in.once.Do(func() {
		if in.never = in.stop(); !in.never {
			<-in.done
		}
	})
	return !in.never && in.ok
}

// userCancelled: ctx ended with the daemon's STOP "cancelled".
func userCancelled(ctx context.Context) bool {
	var se *handover.StopError
	return errors.As(context.Cause(ctx), &se) && se.Class == ClassCancelled
}

// verify is R31 before anything is recorded or admitted: the supervisor's
// native turn boundary must be the one the control plane settled. For a
// quarantined conversation (K13) the sandbox must be the exact retained
// container the control plane recorded; the supervisor must retain the
// record of the interrupted activation — the one the control plane
// admitted the interrupted turn under — at the boundary it reads now (its
// receipt, R26, kept in its state out of the agent's reach: the positive
// evidence that this session is the one that turn left); and the boundary
// must be the settled one (the interrupted turn never reached the agent)
// or one more (it did). A supervisor that lost its state reads 0 and holds
// no record. A state the supervisor took over from a release that kept no
// records, with no turn run since, holds the record saying so
// (Unrecorded, at this boundary): the interrupted turn ran under that
// release, and is verified as that release verified it — the exact
// container and the boundary. It returns the failure class, "" when the
// session may go on.
func (t *turn) verify(sb sandbox.Sandbox, act sandbox.Activation) string {
	tu := t.p.Claim.Turn
	if tu.Quarantined && sb.Version < sandbox.Version2 {
		// A supervisor of the release before retained records can say
		// nothing either way (K13): not evidence of a loss. The turn fails
		// before admission and the conversation stays quarantined; the
		// activation has fenced its agent, so at the next message the
		// backend finds it idle and replaces it, and the new supervisor
		// takes its state over (Unrecorded).
		t.log.Error(diagnostics.MsgSandboxUnavailable, "error_class", "supervisor_outdated", "version", sb.Version)
		return ClassSandboxUnavailable
	}
	if tu.Quarantined && (tu.ContainerID == "" || sb.ID != tu.ContainerID) {
		t.log.Error(diagnostics.MsgContainerReplaced, "container_id", sb.ID, "recorded_container_id", tu.ContainerID)
		return ClassContainerReplaced
	}
	if tu.Quarantined {
		p := act.Previous
		// The record names the interrupted activation, or is the record of
		// a later one that ran nothing since it (LastRan), at this boundary.
		// Or the interrupted activation ran nothing itself (admitted, its
		// turn child stopped before the prompt), and so did every one after
		// it: the record lists it among those (Idle).
		names := p != nil && tu.InterruptedActivationID != "" && (p.Activation == tu.InterruptedActivationID ||
			p.Ended == sandbox.EndedNotRun && (p.LastRan == tu.InterruptedActivationID || slices.Contains(p.Idle, tu.InterruptedActivationID)))
		unrecorded := p != nil && p.Ended == sandbox.EndedNotRun && p.Unrecorded
		if !names && !unrecorded || p.NativeTurn != act.NativeTurn {
			var retained, ended string
			var native int64 = -1
			if p != nil {
				retained, ended, native = p.Activation, p.Ended, p.NativeTurn
			}
			t.log.Error(diagnostics.MsgReceiptMismatch, "retained_activation", retained, "retained_ended", ended,
				"retained_native_turn", native, "interrupted_activation", tu.InterruptedActivationID, "supervisor_native_turn", act.NativeTurn)
			return ClassReceiptMismatch
		}
		if tu.AgentProtocol == wire.AgentProtocolACP && act.NativeTurn > 0 && p.ACPSession == "" {
			// An ACP session that ran turns is resumed only with its kept
			// session id (A6): a record without one is no evidence of it.
			t.log.Error(diagnostics.MsgReceiptMismatch, "retained_activation", p.Activation, "retained_acp_session", false)
			return ClassReceiptMismatch
		}
	}
	ok := act.NativeTurn == tu.NativeTurn || tu.Quarantined && act.NativeTurn == tu.NativeTurn+1
	if !ok {
		t.log.Error(diagnostics.MsgBoundaryMismatch,
			"supervisor_native_turn", act.NativeTurn, "settled_native_turn", tu.NativeTurn, "quarantined", tu.Quarantined)
		return ClassBoundaryMismatch
	}
	return ""
}

// exitClass is the failure class of how the agent ended: agent_exit_<code>
// for a non-zero exit, agent_signal_<NAME> (agent_signal_KILL) when a
// signal ended it; "" for a clean exit.
func exitClass(res sandbox.Result) string {
	switch {
	case res.Failure != "":
		return res.Failure // an ACP turn that ended in a JSON-RPC error or the agent's exit
	case res.Signal != "":
		return ClassAgentSignal + "_" + strings.TrimPrefix(res.Signal, "SIG")
	case res.ExitCode < 0:
		return ClassAgentSignal + "_unknown"
	case res.ExitCode != 0:
		return fmt.Sprintf("%s_%d", ClassAgentExit, res.ExitCode)
	}
	return ""
}

// agentCause is how the agent ended, as its supervisor names it; for a
// supervisor of an earlier release, which names none, as its exit says.
// An ACP turn that ended in a JSON-RPC error or a lost connection has no
// cause of the closed list: unknown, with the failure as its evidence.
func agentCause(res sandbox.Result) (wire.Cause, string) {
	switch {
	case res.Cause != "" && res.Cause.Valid():
		return res.Cause, res.CauseEvidence
	case res.Signal != "":
		return wire.CauseAgentSignal, "the agent was ended by " + res.Signal
	case res.Failure == sandbox.FailureACPAgentExit || res.Failure == "" && res.ExitCode != 0:
		return wire.CauseAgentExit, fmt.Sprintf("the agent exited %d", res.ExitCode)
	case res.Failure != "":
		return wire.CauseUnknown, "the ACP turn failed: " + res.Failure
	}
	return "", ""
}

// forwardLeases sends the supervisor every lease deadline a DEADLINE frame
// brings, until the returned func is called (K5). A deadline that does not
// get through leaves the older one in force, which fences sooner, never
// later.
func (t *turn) forwardLeases(cl *sandbox.Client, activationID string) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.ch.LeaseChanged():
			}
			cctx, ccancel := context.WithTimeout(ctx, supervisorCallTimeout)
			err := cl.SetDeadline(cctx, activationID, t.ch.Lease().Deadline)
			ccancel()
			if err != nil && ctx.Err() == nil {
				t.log.Warn(diagnostics.MsgSupervisorDeadline, "error_class", sandbox.CodeOf(err))
			}
		}
	}()
	return func() { cancel(); <-done }
}

var errSignalled = errors.New("turn child signalled to stop")

// progress sends the Facts so far; a lost PROGRESS only makes the daemon's
// fallback report less precise, never wrong (the store guards every write).
func (t *turn) progress(stage Stage) {
	t.stage = stage
	b, err := json.Marshal(Progress{Stage: stage, Facts: t.sess.Facts(), At: time.Now().UTC()})
	if err == nil {
		_ = t.ch.Progress(b)
	}
}

// event queues one runner event of the turn's own (not the agent's) for
// the job's timeline.
func (t *turn) event(typ string, data map[string]any) {
	b, err := json.Marshal(data)
	if err == nil {
		t.sess.Event(typ, b)
	}
}

// truncate cuts s to at most n bytes, on a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func ms(v int64, def time.Duration) time.Duration {
	if v <= 0 {
		return def
	}
	return time.Duration(v) * time.Millisecond
}

func newLogger(format string, w io.Writer) *slog.Logger {
	if format == "text" {
		return slog.New(slog.NewTextHandler(w, nil))
	}
	return slog.New(slog.NewJSONHandler(w, nil))
}
