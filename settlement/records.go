package settlement

import (
	"context"
	"errors"
	"log/slog"
	"net"
)

// Record names this package writes. Failure records carry classes and
// statuses only: never a URL, a token, a body or an error's text (R16).
const (
	recControlFailure = "agent_control_failure"
	recEventsDropped  = "agent_events_dropped"
	recTurnFailed     = "agent_turn_failed"
)

// Classes of a try that got no HTTP answer.
const (
	ClassTimeout       = "timeout"
	ClassTransport     = "transport"
	ClassCanceled      = "canceled"
	ClassLeaseRejected = "lease_rejected"
)

func (s *Session) recordControlFailure(op, stage string, try int, class string, status int) {
	s.log.LogAttrs(context.Background(), slog.LevelWarn, recControlFailure,
		slog.String("operation", op),
		slog.String("stage", stage),
		slog.String("job_id", s.cfg.JobID),
		slog.String("attempt_id", s.cfg.Attempt.AttemptID),
		slog.Int("try", try),
		slog.String("class", class),
		slog.Int("status", status),
	)
}

func (s *Session) recordEventsDropped(dropped int64) {
	s.log.LogAttrs(context.Background(), slog.LevelWarn, recEventsDropped,
		slog.String("job_id", s.cfg.JobID),
		slog.String("attempt_id", s.cfg.Attempt.AttemptID),
		slog.Int64("dropped", dropped),
	)
}

// recordTurnFailed is the positive record of a failed turn or preparation,
// written whether or not the terminal report gets through (R18, R22).
func (s *Session) recordTurnFailed(stage, class string) {
	s.log.LogAttrs(context.Background(), slog.LevelError, recTurnFailed,
		slog.String("stage", stage),
		slog.String("job_id", s.cfg.JobID),
		slog.String("attempt_id", s.cfg.Attempt.AttemptID),
		slog.String("class", class),
	)
}

// transportClass names a try that got no answer.
func transportClass(ctx context.Context, err error) string {
	if errors.Is(err, ErrLeaseRejected) || errors.Is(context.Cause(ctx), ErrLeaseRejected) {
		return ClassLeaseRejected
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return ClassTimeout
	}
	if errors.Is(err, context.Canceled) {
		return ClassCanceled
	}
	return ClassTransport
}
