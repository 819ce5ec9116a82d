package supervisor

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/runnerd/runnerd/internal/boottime"
	"github.com/runnerd/runnerd/sandbox"
)

// Record names of the supervisor. One helper per record name, so the
// fields cannot drift. No record carries an activation token, a prompt or
// agent output.
const (
	RecordStarted        = "supervisor_started"
	RecordStopped        = "supervisor_stopped"
	RecordActivated      = "supervisor_activated"
	RecordTurnStarted    = "supervisor_turn_started"
	RecordTurnEnded      = "supervisor_turn_ended"
	RecordTurnStopped    = "supervisor_turn_stopped"
	RecordSettled        = "supervisor_settled"
	RecordInterrupting   = "supervisor_interrupting"
	RecordRequestRefused = "supervisor_request_refused"
	RecordStateFailure   = "supervisor_state_failure"
	// RecordStateTakenOver: a state of a release that kept no records was
	// taken over; its turns, up to native_turn, ran unrecorded.
	RecordStateTakenOver = "supervisor_state_taken_over"
	// RecordBoundaryCompleted: the last turn's record was on disk but its
	// native turn was not (a kill between the two writes); the boundary
	// was moved on to the record's.
	RecordBoundaryCompleted = "supervisor_boundary_completed"
	RecordOrphanReaped      = "supervisor_orphan_reaped"
	RecordFailed            = "supervisor_failed"
	RecordACPPrepared       = "supervisor_acp_prepared"
	// RecordACPNotLoadable: the conversation's ACP session cannot be
	// resumed in a new agent process; reason says why.
	RecordACPNotLoadable = "supervisor_acp_session_not_loadable"
	// The timeline of what runs, written as it happens so that a checker
	// outside can judge overlap on every agent: a lines
	// agent's start and exit, and an ACP agent's turn (its session/prompt
	// sent, its answer or failure received; the agent itself is kept).
	// Each carries the supervisor's instance and the activation's
	// generation (the non-secret part of the activation id the control
	// plane records: instance.generation.secret), the agent's pid (in
	// the sandbox's pid namespace), boottime_ns (CLOCK_BOOTTIME when it
	// was seen) and, at a start, pid_start_ticks (the pid's start time in
	// /proc/PID/stat, clock ticks since boot: pid and start name one
	// process, and the start is no later than the kernel's).
	RecordAgentStarted   = "supervisor_agent_started"
	RecordAgentExited    = "supervisor_agent_exited"
	RecordACPPromptSent  = "supervisor_acp_prompt_sent"
	RecordACPPromptEnded = "supervisor_acp_prompt_ended"
	// RecordTeardownIncomplete: processes of a stopped turn's agent tree
	// still ran TeardownBudget after the stop (S6). The daemon's record
	// of the same kind (diagnostics.MsgSandboxTeardownIncomplete) has the
	// same name, so one search finds both.
	RecordTeardownIncomplete = "sandbox_teardown_incomplete"
)

func recordAgentStarted(l *slog.Logger, instance string, gen uint64, pid int) {
	l.Info(RecordAgentStarted, slog.String("instance", instance), slog.Uint64("generation", gen), slog.Int("pid", pid),
		slog.Int64("boottime_ns", int64(boottime.Now())), slog.Int64("pid_start_ticks", pidStartTicks(pid)))
}

func recordAgentExited(l *slog.Logger, instance string, gen uint64, pid int) {
	l.Info(RecordAgentExited, slog.String("instance", instance), slog.Uint64("generation", gen), slog.Int("pid", pid),
		slog.Int64("boottime_ns", int64(boottime.Now())))
}

func recordACPPromptSent(l *slog.Logger, instance string, gen uint64, pid int) {
	l.Info(RecordACPPromptSent, slog.String("instance", instance), slog.Uint64("generation", gen), slog.Int("pid", pid),
		slog.Int64("boottime_ns", int64(boottime.Now())), slog.Int64("pid_start_ticks", pidStartTicks(pid)))
}

// recordACPPromptEnded: stop_reason is the agent's answer, empty when the
// prompt failed (failed says so).
func recordACPPromptEnded(l *slog.Logger, instance string, gen uint64, pid int, stopReason string, failed bool) {
	l.Info(RecordACPPromptEnded, slog.String("instance", instance), slog.Uint64("generation", gen), slog.Int("pid", pid),
		slog.Int64("boottime_ns", int64(boottime.Now())), slog.String("stop_reason", stopReason), slog.Bool("failed", failed))
}

// pidStartTicks is field 22 of /proc/PID/stat, 0 if it cannot be read.
func pidStartTicks(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:])) // from field 3 (state)
	if len(f) < 20 {
		return 0
	}
	n, _ := strconv.ParseInt(f[19], 10, 64)
	return n
}

var discardLogger = slog.New(slog.DiscardHandler)

func recordACPPrepared(l *slog.Logger, pid int, loaded, loadSession bool) {
	l.Info(RecordACPPrepared, slog.Int("pid", pid), slog.Bool("loaded", loaded), slog.Bool("load_session", loadSession))
}

func recordACPNotLoadable(l *slog.Logger, reason string) {
	l.Warn(RecordACPNotLoadable, slog.String("reason", reason))
}

func recordStarted(l *slog.Logger, nativeTurn int64) {
	l.Info(RecordStarted, slog.Int64("native_turn", nativeTurn))
}

func recordStopped(l *slog.Logger) {
	l.Info(RecordStopped)
}

func recordActivated(l *slog.Logger, gen uint64, stoppedTurn bool) {
	l.Info(RecordActivated, slog.Uint64("generation", gen), slog.Bool("stopped_running_turn", stoppedTurn))
}

func recordTurnStarted(l *slog.Logger, gen uint64, pid int) {
	l.Info(RecordTurnStarted, slog.Uint64("generation", gen), slog.Int("pid", pid))
}

func recordTurnEnded(l *slog.Logger, gen uint64, r sandbox.Result) {
	l.Info(RecordTurnEnded, slog.Uint64("generation", gen), slog.Int("exit_code", r.ExitCode),
		slog.String("signal", r.Signal), slog.Int64("native_turn", r.NativeTurn),
		slog.String("cause", string(r.Cause)), slog.String("cause_evidence", r.CauseEvidence))
}

func recordTurnStopped(l *slog.Logger, gen uint64, reason string) {
	l.Warn(RecordTurnStopped, slog.Uint64("generation", gen), slog.String("reason", reason))
}

func recordSettled(l *slog.Logger, gen uint64, nativeTurn int64, exitCode int, interrupted bool) {
	l.Info(RecordSettled, slog.Uint64("generation", gen), slog.Int64("native_turn", nativeTurn), slog.Int("exit_code", exitCode),
		slog.Bool("interrupted", interrupted))
}

func recordInterrupting(l *slog.Logger, gen uint64, grace time.Duration) {
	l.Info(RecordInterrupting, slog.Uint64("generation", gen), slog.Int64("grace_ms", grace.Milliseconds()))
}

func recordRefused(l *slog.Logger, op, code string) {
	l.Warn(RecordRequestRefused, slog.String("op", op), slog.String("code", code))
}

func recordStateFailure(l *slog.Logger, stage string) {
	l.Error(RecordStateFailure, slog.String("stage", stage))
}

func recordStateTakenOver(l *slog.Logger, nativeTurn int64) {
	l.Info(RecordStateTakenOver, slog.Int64("native_turn", nativeTurn))
}

func recordBoundaryCompleted(l *slog.Logger, from, to int64) {
	l.Warn(RecordBoundaryCompleted, slog.Int64("native_turn_on_disk", from), slog.Int64("native_turn", to))
}

func recordOrphanReaped(l *slog.Logger, pid int) {
	l.Info(RecordOrphanReaped, slog.Int("pid", pid))
}

// recordTeardownIncomplete: processes of a stopped turn's agent tree
// (held from its stop) still ran budget after it (S6).
func recordTeardownIncomplete(l *slog.Logger, gen uint64, why string, agent int, pids []int, budget time.Duration) {
	l.Error(RecordTeardownIncomplete, slog.Uint64("generation", gen), slog.String("teardown", why),
		slog.Int("agent_pid", agent), slog.Any("pids", pids), slog.Int64("budget_ms", budget.Milliseconds()))
}

func recordFailed(l *slog.Logger, class string) {
	l.Error(RecordFailed, slog.String("class", class))
}
