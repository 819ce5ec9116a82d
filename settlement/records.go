package settlement

import (
	"context"
	"log/slog"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/internal/retry"
)

// MsgReportRetry is the record of each pause of a write under the report
// policy (K1): which write, how many tries failed in a row, the last
// failure's class and status, and the pause before the next try. The
// failure itself is recorded once per change (agent_control_failure).
const MsgReportRetry = "agent_report_retry"

func (s *Session) attempt() diagnostics.Attempt { return s.rep.attempt() }

func (r *Reporter) recordRetry(op string, f retry.Failure) {
	r.cfg.Logger.LogAttrs(context.Background(), slog.LevelWarn, MsgReportRetry,
		slog.String(diagnostics.KeyJobID, r.cfg.JobID), slog.String(diagnostics.KeyAttemptID, r.cfg.Attempt.AttemptID),
		slog.String(diagnostics.KeyOp, op), slog.Int(diagnostics.KeyConsecutive, f.Try),
		slog.String(diagnostics.KeyClass, diagnostics.Class(f.Err)), slog.Int(diagnostics.KeyStatus, diagnostics.Status(f.Err)),
		slog.Int64(diagnostics.KeyNextDelay, f.Next.Milliseconds()))
}
