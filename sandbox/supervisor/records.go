package supervisor

import (
	"log/slog"

	"github.com/runnerd/runnerd/sandbox"
)

// One helper per record name, so the fields cannot drift. No record carries
// an activation token, a prompt or agent output.

func recordStarted(l *slog.Logger, nativeTurn int64) {
	l.Info("supervisor_started", slog.Int64("native_turn", nativeTurn))
}

func recordStopped(l *slog.Logger) {
	l.Info("supervisor_stopped")
}

func recordActivated(l *slog.Logger, gen uint64, stoppedTurn bool) {
	l.Info("supervisor_activated", slog.Uint64("generation", gen), slog.Bool("stopped_running_turn", stoppedTurn))
}

func recordTurnStarted(l *slog.Logger, gen uint64, pid int) {
	l.Info("supervisor_turn_started", slog.Uint64("generation", gen), slog.Int("pid", pid))
}

func recordTurnEnded(l *slog.Logger, gen uint64, r sandbox.Result) {
	l.Info("supervisor_turn_ended", slog.Uint64("generation", gen), slog.Int("exit_code", r.ExitCode),
		slog.String("signal", r.Signal), slog.Int64("native_turn", r.NativeTurn))
}

func recordTurnStopped(l *slog.Logger, gen uint64, reason string) {
	l.Warn("supervisor_turn_stopped", slog.Uint64("generation", gen), slog.String("reason", reason))
}

func recordSettled(l *slog.Logger, gen uint64, nativeTurn int64, exitCode int) {
	l.Info("supervisor_settled", slog.Uint64("generation", gen), slog.Int64("native_turn", nativeTurn), slog.Int("exit_code", exitCode))
}

func recordRefused(l *slog.Logger, op, code string) {
	l.Warn("supervisor_request_refused", slog.String("op", op), slog.String("code", code))
}

func recordStateFailure(l *slog.Logger, stage string) {
	l.Error("supervisor_state_failure", slog.String("stage", stage))
}

func recordOrphanReaped(l *slog.Logger, pid int) {
	l.Info("supervisor_orphan_reaped", slog.Int("pid", pid))
}
