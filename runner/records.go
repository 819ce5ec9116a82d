package runner

import (
	"context"
	"log/slog"
	"time"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/handover"
)

// The daemon's own record names, beside diagnostics' agent_* records. Like
// those they carry ids, classes and statuses, never a token, URL, body or
// error text.
const (
	MsgStarted           = "runnerd_started"                          // effective configuration, once
	MsgHostTokenRefused  = "runnerd_host_token_refused"               // claiming stopped; running turns go on
	MsgHostRegistered    = "runnerd_host_registered"                  // the daemon registered itself with its registration token and stored its own host token (file)
	MsgRegisterFailed    = "runnerd_register_failed"                  // a registration attempt failed and is retried (status, class)
	MsgHostTokenRotated  = "runnerd_host_token_rotated"               // a heartbeat answer carried a rotated host token: stored (file) or, failing that, held in memory only (class)
	MsgLaunchFailed      = "runnerd_launch_failed"                    // a launch failure (R37) and the pause it caused
	MsgConversationFault = "runnerd_turn_declined_conversation_fault" // a turn declined for its conversation's own fault (S4: class image_missing, agent_command_missing, invalid_sandbox_spec; limits: limits_unsupported): released, never a launch failure
	MsgTurnAccepted      = "runnerd_turn_accepted"                    // the child accepted its turn (R35: never released now)
	MsgTurnReleased      = "runnerd_turn_released"                    // a never-accepted claim was given back (R33)
	MsgTurnEnded         = "runnerd_turn_ended"                       // an accepted child ended
	MsgTurnStopped       = "runnerd_turn_stopped"                     // the daemon stopped a turn, and why
	MsgReportSent        = "runnerd_report_sent"                      // a terminal report or release was acknowledged
	MsgReportAbandoned   = "runnerd_report_unsent"                    // a report could not be sent; it stays persisted or the reaper decides
	MsgReportRefused     = "runnerd_report_refused"                   // the control plane refused a report or the restart's lease question with a status no retry changes (400): kept on disk for a person
	MsgPersistFailed     = "runnerd_persist_failed"                   // the state directory refused a write
	MsgRecovered         = "runnerd_attempt_recovered"                // a persisted attempt was resolved at start (P5, P6)
	MsgStateCorrupt      = "runnerd_state_corrupt"                    // a persisted attempt could not be read; moved aside
	MsgSandboxRemoved    = "runnerd_sandbox_removed"                  // a LOST conversation's sandbox was removed
	MsgSandboxKept       = "runnerd_sandbox_not_removed"
	MsgSandboxSwept      = "runnerd_sandbox_swept"        // the sweep removed a sandbox: reason lost, deleted, or recorded_elsewhere (sandbox_host)
	MsgSweepFailed       = "runnerd_sandbox_sweep_failed" // the backend could not list its sandboxes; once per run of failures
	MsgSweepOff          = "runnerd_sandbox_sweep_off"    // the sweep cannot work here (backend, or until the control plane has the call), and why
	MsgClusterChanged    = "runnerd_cluster_changed"      // the control plane is not the cluster pinned at first contact: no sandbox that recorded no cluster of its own is removed on its word (K8)
	// MsgSweepOtherCluster: the sweep's control plane (cluster_id) may not
	// judge kept of this host's sandboxes — created under another cluster,
	// which alone may remove them, or recording none and the host pinned
	// another (K8 per sandbox); once per cluster and count.
	MsgSweepOtherCluster = "runnerd_sandbox_sweep_other_cluster"
	MsgControlRecovered  = "runnerd_control_recovered" // claims or host heartbeats answer again
	MsgDrainStarted      = "runnerd_drain_started"     // claiming stopped to take the host out of service: running, limit_ms
	MsgDrainTimeout      = "runnerd_drain_timeout"     // the drain's limit passed: the turns still running are stopped
	MsgDrainEnded        = "runnerd_drain_ended"       // a second drain request: the turns still running are stopped now
	MsgHandoverStarted   = "runnerd_handover_started"  // SIGTERM: claiming stopped, every running turn is left for the next start (P5)
	MsgTurnHandedOver    = "runnerd_turn_handed_over"  // one accepted turn left running, its child waiting to be re-attached: pid
	MsgStopped           = "runnerd_stopped"           // the end: handover, handed_over (turns), unanswered (launches not answered in time)
	MsgWatchdogUnhealthy = "runnerd_watchdog_unhealthy"
	MsgNotifyFailed      = "runnerd_notify_failed"
	MsgMetricsListening  = "runnerd_metrics_listening"  // /metrics is served: address
	MsgTokenFileMode     = "runnerd_token_file_mode"    // the host token file is readable by others
	MsgClaimsWithheld    = "runnerd_claims_withheld"    // the sandbox backend does not answer: no claim, no READY, until it does
	MsgClaimsResumed     = "runnerd_claims_resumed"     // the sandbox backend answers again
	MsgHangupIgnored     = "runnerd_sighup_ignored"     // SIGHUP: nothing is reloaded, every turn goes on (K11)
	MsgCancelReceived    = "runnerd_cancel_received"    // the user's cancel reached a turn: via renewal or host_poll (K10)
	MsgCancelPollFailed  = "runnerd_cancel_poll_failed" // the host's cancel poll failed (class, status); once per run of failures, the renewal answer stays the fallback
	MsgTurnScopes        = "runnerd_turn_scopes"        // at start: where turn children live (mechanism), and why not in scopes
	// MsgEndpointMissing: a host call (claim, host heartbeat) was answered
	// 404 — the control-plane address serves no such endpoint; retried.
	MsgEndpointMissing      = "runnerd_control_plane_endpoint_missing"
	MsgTurnExecutable       = "runnerd_turn_executable"        // at start: what turn children and supervisors run (runnerd-child or runnerd), and why not runnerd-child
	MsgTurnScopeFailed      = "runnerd_turn_scope_failed"      // a child could not be moved into its scope (class); its turn runs on
	MsgTurnReattached       = "runnerd_turn_reattached"        // a turn child of an earlier run was taken over at start (P5): how long it was orphaned
	MsgReattachRefused      = "runnerd_reattach_refused"       // a surviving turn child speaks a protocol version this daemon does not: it was stopped
	MsgReattachPending      = "runnerd_reattach_pending"       // a surviving turn child may be running but could not be re-attached (pid, alive, class, try, pause_ms): kept, renewed and tried again
	MsgControlPlaneSwitched = "runnerd_control_plane_switched" // --control-plane lists several: calls moved from one address to another (a failure, or the preferred one answers again)
	MsgClaimBatchRefused    = "runnerd_claim_batch_refused"    // the control plane predates batched claims (400 unknown_field on max_claims): one turn per claim from now on
	MsgClaimPinnedRefused   = "runnerd_claim_pinned_refused"   // the control plane predates pinned_only (400 unknown_field): under host pressure (S2) nothing is claimed
)

// Field keys of the daemon's records (diagnostics' keys where they exist).
const (
	keyOutcome       = "outcome"
	keyDecision      = "decision"
	keyPauseMS       = "pause_ms"
	keyConversation  = "conversation_id"
	keyJobState      = "job_state"
	keyConvState     = "conversation_state"
	keyBackend       = "backend"
	keyLoop          = "loop"
	keyFile          = "file"
	keyStopped       = "stopped"
	keyTimedOut      = "timed_out"
	keyReason        = "reason"
	keySandboxHost   = "sandbox_host"
	keyPinnedCluster = "pinned_cluster_id"
	keySeenCluster   = "cluster_id"
	keyKept          = "kept"
	keySource        = "source"
	keyRunning       = "running"
	keyMechanism     = "mechanism"
	keyCgroup        = "cgroup"
	keyScope         = "scope"
	keyOrphanedMS    = "orphaned_ms"
	keyExecLeftMS    = "exec_left_ms"
	keyAlive         = "alive"
	keyTry           = "try"
	keyVersion       = "protocol_version"
	keyHandover      = "handover"
	keyHandedOver    = "handed_over"
	keyUnanswered    = "unanswered"
)

// Hangup records a SIGHUP (K11). Every setting comes from flags and the
// environment, which a running process cannot read again, so there is
// nothing to reload: the signal changes nothing, and the record says how
// many turns it left running.
func (d *Daemon) Hangup() {
	d.log.LogAttrs(context.Background(), slog.LevelInfo, MsgHangupIgnored, slog.Int(keyRunning, d.running()))
}

// logReattached is MsgTurnReattached: the child's pid, how long it ran
// without a daemon and how long the daemon's execution timer gives it.
func (d *Daemon) logReattached(a diagnostics.Attempt, pid int, orphaned, execLeft time.Duration) {
	d.logAttempt(slog.LevelInfo, MsgTurnReattached, a, slog.Int("pid", pid), slog.Int64(keyOrphanedMS, orphaned.Milliseconds()),
		slog.Int64(keyExecLeftMS, execLeft.Milliseconds()))
}

// logReattachPending is MsgReattachPending: the child's pid (0 when the
// socket could not be reached), whether it may be running, the class of the
// failure, the try (0: the first, at start) and the pause before the next.
func (d *Daemon) logReattachPending(a diagnostics.Attempt, ua *handover.Unattached, try int, pause time.Duration) {
	d.logAttempt(slog.LevelWarn, MsgReattachPending, a, slog.Int("pid", ua.PID), slog.Bool(keyAlive, ua.Alive()),
		slog.String(diagnostics.KeyClass, diagnostics.Class(ua.Err)), slog.Int(keyTry, try), slog.Int64(keyPauseMS, pause.Milliseconds()))
}

// handOver leaves an accepted turn running at the handover (P5): nothing
// is sent to its child and nothing about it to the control plane; the
// state file stays for the next start, which re-attaches it.
func (d *Daemon) handOver(a *attempt, t *handover.Turn) {
	d.handedOver.Add(1)
	d.logAttempt(slog.LevelInfo, MsgTurnHandedOver, a.id, slog.Int("pid", t.PID()))
}

// logReattachRefused is MsgReattachRefused: the child's protocol version.
func (d *Daemon) logReattachRefused(a diagnostics.Attempt, version uint8) {
	d.logAttempt(slog.LevelWarn, MsgReattachRefused, a, slog.Int(keyVersion, int(version)))
}

func attrsOf(a diagnostics.Attempt) []slog.Attr {
	return []slog.Attr{slog.String(diagnostics.KeyJobID, a.JobID), slog.String(diagnostics.KeyAttemptID, a.AttemptID)}
}

func (d *Daemon) logAttempt(level slog.Level, msg string, a diagnostics.Attempt, extra ...slog.Attr) {
	d.log.LogAttrs(context.Background(), level, msg, append(attrsOf(a), extra...)...)
}

func (d *Daemon) logLaunchFailed(a diagnostics.Attempt, outcome, class string, consecutive int, pause time.Duration) {
	d.logAttempt(slog.LevelWarn, MsgLaunchFailed, a,
		slog.String(keyOutcome, outcome), slog.String(diagnostics.KeyClass, class),
		slog.Int(diagnostics.KeyConsecutive, consecutive), slog.Int64(keyPauseMS, pause.Milliseconds()))
}

func (d *Daemon) logErrClass(level slog.Level, msg string, a diagnostics.Attempt, op string, err error) {
	d.logAttempt(level, msg, a, slog.String(diagnostics.KeyOp, op),
		slog.String(diagnostics.KeyClass, diagnostics.Class(err)), slog.Int(diagnostics.KeyStatus, diagnostics.Status(err)))
}
