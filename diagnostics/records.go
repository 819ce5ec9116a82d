package diagnostics

import (
	"context"
	"log/slog"
	"time"
)

// Record names (R15, R18). They are stable: operators search for them.
const (
	MsgAttemptClaimed     = "agent_attempt_claimed"
	MsgControlFailure     = "agent_control_failure"
	MsgHeartbeatRetry     = "agent_heartbeat_retry"
	MsgHeartbeatRecovered = "agent_heartbeat_recovered"
	MsgLeaseExpired       = "agent_lease_expired"
	MsgLeaseLost          = "agent_lease_lost"
	MsgCredentialRefused  = "agent_credential_refused"
	MsgHeartbeatStopped   = "agent_heartbeat_stopped"
	MsgExecutionTimeout   = "agent_execution_timeout"
	MsgTurnCancelled      = "agent_turn_cancelled"
	MsgAgentExit          = "agent_exit"
	MsgConfigIgnored      = "agent_config_ignored"
	MsgEventsDropped      = "agent_events_dropped"
	MsgTurnFailed         = "agent_turn_failed"
	// MsgControlPlanePlainHTTP: at start, the control plane is an http://
	// address of another host — tokens and prompts cross the network in
	// the clear (use https:// with --ca-file).
	MsgControlPlanePlainHTTP = "agent_control_plane_plain_http"

	// Written by the turn child (runner/turn) with the attempt's ids.
	MsgTurnDeclined        = "agent_turn_declined"              // preflight declined the turn before ACCEPT: class
	MsgAcceptFailed        = "agent_turn_accept_failed"         // ACCEPT could not be sent; nothing was done
	MsgResultUndelivered   = "agent_turn_result_undelivered"    // the turn's result could not reach the daemon
	MsgSandboxUnavailable  = "agent_sandbox_unavailable"        // the sandbox could not be ensured
	MsgImageUnavailable    = "agent_image_unavailable"          // the sandbox's image is not on this host and could not be pulled (S4: the turn fails before admission)
	MsgActivationFailed    = "agent_activation_failed"          // the supervisor refused or failed activation
	MsgAgentPrepareFailed  = "agent_prepare_failed"             // an ACP agent could not be started, initialized or given its session
	MsgBoundaryMismatch    = "agent_native_boundary_mismatch"   // the supervisor's native turn is not the settled one (R31)
	MsgContainerReplaced   = "agent_container_replaced"         // a quarantined conversation's sandbox is not its recorded container (K13)
	MsgReceiptMismatch     = "agent_retained_receipt_mismatch"  // a quarantined conversation's supervisor retains no record of the interrupted activation (K13)
	MsgSupervisorOutdated  = "agent_supervisor_outdated"        // the turn runs with an older supervisor protocol's features
	MsgConversationResumed = "agent_conversation_resumed"       // a quarantined conversation's verified boundary was recorded (K13)
	MsgTurnInterrupted     = "agent_turn_interrupted"           // the agent's stream broke before its result
	MsgTurnLeaseDeadline   = "agent_turn_lease_deadline"        // the child's own lease deadline passed: agent stopped, nothing more written (K5)
	MsgSupervisorDeadline  = "agent_supervisor_deadline_failed" // a renewed lease deadline did not reach the supervisor: class
	// K10: the user's cancel interrupted the agent at the supervisor, which
	// settled an interrupted boundary (native_turn, took_ms) — or could not
	// (class): the driving connection is then dropped and the turn fails closed.
	MsgTurnInterruptedOnCancel = "agent_turn_interrupted_on_cancel"
	MsgTurnInterruptFailed     = "agent_turn_interrupt_failed"
	// A4: the owner's answer to an ACP permission request, polled from the
	// control plane, was passed to the supervisor (request_id, option_id) —
	// or could not be (class): the request then ends at its timeout.
	MsgPermissionAnswerPassed = "agent_permission_answer_passed"
	MsgPermissionAnswerFailed = "agent_permission_answer_failed"
	// S1: idle eviction. The daemon stopped a conversation's retained
	// sandbox after --sandbox-idle without a turn (conversation_id,
	// idle_ms, backend), kept, not deleted; a turn of it claimed later
	// wakes it (conversation_id, stopped_ms, backend) through the turn's
	// Ensure, which starts it again as after a supervisor restart (K13's
	// verification follows). A failed eviction keeps the sandbox running
	// (class) and is tried again next round.
	MsgSandboxEvicted     = "sandbox_evicted"
	MsgSandboxWoken       = "sandbox_woken"
	MsgSandboxEvictFailed = "sandbox_evict_failed"
	// S6: a teardown (teardown: idle, pressure, delete) did not prove the
	// sandbox's processes gone within --teardown-budget (budget_ms): pids
	// names the process backend's survivors, container_id the docker
	// backend's container the engine still reports running or present.
	// The stop or removal went ahead; what is named outlived it.
	MsgSandboxTeardownIncomplete = "sandbox_teardown_incomplete"
	// The daemon's spare turn child, started before any
	// claim and waiting on its descriptor with nothing handed to it. It
	// was discarded without a payload (reason: exited, outdated — the
	// executable changed since it started —, assign_failed, stopped; pid),
	// or could not be started (class). Neither concerns a claim (R33).
	MsgSpareDiscarded = "runnerd_spare_discarded"
	MsgSpareFailed    = "runnerd_spare_failed"
	// S2: host pressure. Free disk or memory fell below --min-free-disk or
	// --min-free-memory and, with every idle sandbox it could stop
	// stopped (sandbox_evicted with cause pressure), is still short: the
	// daemon takes no conversation's first turn (resource, free_bytes,
	// total_bytes, min_free_bytes), until it is not (cleared, the same
	// fields as measured then). A free space or memory the daemon cannot
	// measure (class, path) counts as no pressure, recorded once.
	MsgSandboxPressure           = "runnerd_sandbox_pressure"
	MsgSandboxPressureCleared    = "runnerd_sandbox_pressure_cleared"
	MsgSandboxPressureUnmeasured = "runnerd_sandbox_pressure_unmeasured"
	// Two daemons presenting one host token. The control
	// plane refused this daemon's heartbeat or claim 409
	// host_token_in_use: another instance of the host is live (op); this
	// one claims nothing and keeps heartbeating, recorded once until a
	// heartbeat is accepted again (in_use_cleared: the other one stopped
	// or fell silent past the host's offline bound). The control plane's
	// own record of each refusal is controlplane.MsgHostTokenInUse.
	MsgHostTokenInUse        = "runnerd_host_token_in_use"
	MsgHostTokenInUseCleared = "runnerd_host_token_in_use_cleared"
)

// Field keys. Durations are whole milliseconds so that text and JSON
// handlers print the same number.
const (
	KeyJobID       = "job_id"
	KeyAttemptID   = "attempt_id"
	KeyGeneration  = "lease_generation"
	KeyWorkerID    = "worker_id"
	KeyHostID      = "host_id"
	KeyOp          = "op"
	KeyClass       = "class"
	KeyStatus      = "status"
	KeyConsecutive = "consecutive_failures"
	KeySinceAck    = "since_ack_ms"
	KeyNextDelay   = "next_delay_ms"
	KeyRenewals    = "renewals"
	KeyLimit       = "limit_ms"
	KeySource      = "source"
	KeyExitCode    = "exit_code"
	KeySignal      = "signal"
	KeySetting     = "setting"
	KeyGiven       = "given_ms"
	KeyUsed        = "used_ms"
	KeyReason      = "reason"
	KeyDropped     = "dropped"
	KeyStage       = "stage"
	KeyIdle        = "idle_ms"    // how long a sandbox had no turn (S1)
	KeyStoppedFor  = "stopped_ms" // how long a sandbox was stopped before its wake (S1)
	// S2: why a sandbox was evicted (idle, pressure) and what was short.
	KeyCause        = "cause"
	KeyResource     = "resource"
	KeyFreeBytes    = "free_bytes"
	KeyTotalBytes   = "total_bytes"
	KeyMinFreeBytes = "min_free_bytes"
	KeyPath         = "path"
	// S6: which teardown, and what outlived it.
	KeyTeardown  = "teardown"
	KeyPIDs      = "pids"
	KeyContainer = "container_id"
	KeyBudget    = "budget_ms"
)

// Attempt names the attempt a record is about.
type Attempt struct {
	JobID     string
	AttemptID string
}

func (a Attempt) attrs() []slog.Attr {
	return []slog.Attr{slog.String(KeyJobID, a.JobID), slog.String(KeyAttemptID, a.AttemptID)}
}

// Recorder writes the records. The zero value discards them.
type Recorder struct {
	l *slog.Logger
}

// NewRecorder writes to l; nil discards.
func NewRecorder(l *slog.Logger) Recorder { return Recorder{l: l} }

func (r Recorder) log(ctx context.Context, level slog.Level, msg string, a Attempt, extra ...slog.Attr) {
	if r.l == nil {
		return
	}
	r.l.LogAttrs(ctx, level, msg, append(a.attrs(), extra...)...)
}

func ms(d time.Duration) int64 { return d.Milliseconds() }

// AttemptClaimed: a turn was claimed (R15).
func (r Recorder) AttemptClaimed(ctx context.Context, a Attempt, generation int64, workerID, hostID string) {
	r.log(ctx, slog.LevelInfo, MsgAttemptClaimed, a,
		slog.Int64(KeyGeneration, generation), slog.String(KeyWorkerID, workerID), slog.String(KeyHostID, hostID))
}

// ControlFailure: a control-plane call failed (R15, R16). op is a fixed
// stage name such as "renew" or "finish"; the class and status come from err.
func (r Recorder) ControlFailure(ctx context.Context, op string, a Attempt, err error) {
	r.log(ctx, slog.LevelWarn, MsgControlFailure, a,
		slog.String(KeyOp, op), slog.String(KeyClass, Class(err)), slog.Int(KeyStatus, Status(err)))
}

// HeartbeatRetry: renewal failed again and will be retried after next (R15, R17).
// sinceAck is measured from the last acknowledged renewal's send time, or
// from the claim when none was acknowledged yet.
func (r Recorder) HeartbeatRetry(ctx context.Context, a Attempt, consecutive int, sinceAck, next time.Duration) {
	r.log(ctx, slog.LevelWarn, MsgHeartbeatRetry, a,
		slog.Int(KeyConsecutive, consecutive), slog.Int64(KeySinceAck, ms(sinceAck)), slog.Int64(KeyNextDelay, ms(next)))
}

// HeartbeatRecovered: a renewal was acknowledged after failures (R15).
func (r Recorder) HeartbeatRecovered(ctx context.Context, a Attempt, failures int, sinceAck time.Duration) {
	r.log(ctx, slog.LevelInfo, MsgHeartbeatRecovered, a,
		slog.Int(KeyConsecutive, failures), slog.Int64(KeySinceAck, ms(sinceAck)))
}

// LeaseExpired: the last acknowledgement became a whole lease old (R10, R18);
// lastErr is the last renewal's failure, classified.
func (r Recorder) LeaseExpired(ctx context.Context, a Attempt, consecutive int, sinceAck time.Duration, lastErr error) {
	r.log(ctx, slog.LevelError, MsgLeaseExpired, a,
		slog.Int(KeyConsecutive, consecutive), slog.Int64(KeySinceAck, ms(sinceAck)),
		slog.String(KeyClass, Class(lastErr)), slog.Int(KeyStatus, Status(lastErr)))
}

// LeaseLost: the control plane rejected the lease, 409 or 410 (R8, R18).
func (r Recorder) LeaseLost(ctx context.Context, a Attempt, status int) {
	r.log(ctx, slog.LevelError, MsgLeaseLost, a, slog.String(KeyClass, StatusClass(status)), slog.Int(KeyStatus, status))
}

// CredentialRefused: 401, 403 or 404 on the attempt's own call (R11, R18).
func (r Recorder) CredentialRefused(ctx context.Context, a Attempt, status int) {
	r.log(ctx, slog.LevelError, MsgCredentialRefused, a, slog.String(KeyClass, StatusClass(status)), slog.Int(KeyStatus, status))
}

// HeartbeatStopped: the owner ended renewal; renewals is how many were acknowledged.
func (r Recorder) HeartbeatStopped(ctx context.Context, a Attempt, renewals int) {
	r.log(ctx, slog.LevelInfo, MsgHeartbeatStopped, a, slog.Int(KeyRenewals, renewals))
}

// ExecutionTimeout: the turn ran past its execution timeout (R5, R18).
func (r Recorder) ExecutionTimeout(ctx context.Context, a Attempt, limit time.Duration) {
	r.log(ctx, slog.LevelWarn, MsgExecutionTimeout, a, slog.Int64(KeyLimit, ms(limit)))
}

// Cancellation sources for TurnCancelled.
const (
	CancelByUser  = "user"  // cancel_requested in a renewal answer (P7)
	CancelByDrain = "drain" // the daemon is stopping
)

// TurnCancelled: the turn was explicitly cancelled (R18). source is
// CancelByUser or CancelByDrain.
func (r Recorder) TurnCancelled(ctx context.Context, a Attempt, source string) {
	r.log(ctx, slog.LevelInfo, MsgTurnCancelled, a, slog.String(KeySource, source))
}

// AgentExit: the agent process exited (R18). signal is the signal's name
// ("SIGKILL") when it was killed, else "".
func (r Recorder) AgentExit(ctx context.Context, a Attempt, exitCode int, signal string) {
	r.log(ctx, slog.LevelInfo, MsgAgentExit, a, slog.Int(KeyExitCode, exitCode), slog.String(KeySignal, signal))
}

// ConfigIgnored: a setting was ignored in favour of used (R12). given is
// zero when the value could not be read at all; reason is a fixed phrase.
func (r Recorder) ConfigIgnored(ctx context.Context, setting string, given, used time.Duration, reason string) {
	if r.l == nil {
		return
	}
	r.l.LogAttrs(ctx, slog.LevelWarn, MsgConfigIgnored,
		slog.String(KeySetting, setting), slog.Int64(KeyGiven, ms(given)), slog.Int64(KeyUsed, ms(used)), slog.String(KeyReason, reason))
}

// EventsDropped: events were dropped because the upload buffer was full or
// the attempt was over; dropped is the attempt's running total.
func (r Recorder) EventsDropped(ctx context.Context, a Attempt, dropped int64) {
	r.log(ctx, slog.LevelWarn, MsgEventsDropped, a, slog.Int64(KeyDropped, dropped))
}

// Stages of TurnFailed.
const (
	StageTurn        = "turn"        // the turn's terminal report says failed
	StagePreparation = "preparation" // post-claim preparation failed (R22)
)

// TurnFailed: the positive record of a failed turn or preparation, written
// whether or not the terminal report gets through (R18, R22). stage is
// StageTurn or StagePreparation; class is the report's failure class.
func (r Recorder) TurnFailed(ctx context.Context, a Attempt, stage, class string) {
	r.log(ctx, slog.LevelError, MsgTurnFailed, a, slog.String(KeyStage, stage), slog.String(KeyClass, class))
}
