package settlement

import (
	"context"
	"log/slog"

	"github.com/runnerd/runnerd/diagnostics"
)

// Records of this package that diagnostics does not name (yet). Their
// fields use the diagnostics keys; failure records carry classes and
// statuses only, never a URL, a token, a body or an error's text (R16).
const (
	// MsgEventsDropped: events were dropped because the upload buffer was
	// full (or the attempt was over); dropped is the running total.
	MsgEventsDropped = "agent_events_dropped"
	// MsgTurnFailed: the positive record of a failed turn or preparation,
	// written whether or not the terminal report gets through (R18, R22).
	MsgTurnFailed = "agent_turn_failed"
)

// Field keys of the records above, beside the diagnostics keys.
const (
	keyDropped = "dropped"
	keyStage   = "stage"
)

func (s *Session) attempt() diagnostics.Attempt {
	return diagnostics.Attempt{JobID: s.cfg.JobID, AttemptID: s.cfg.Attempt.AttemptID}
}

// recordControlFailure writes one agent_control_failure for a failed try;
// err is a *wire.StatusError or a transport error, classified by diagnostics.
func (s *Session) recordControlFailure(op string, err error) {
	s.rec.ControlFailure(context.Background(), op, s.attempt(), err)
}

func (s *Session) recordEventsDropped(dropped int64) {
	s.log.LogAttrs(context.Background(), slog.LevelWarn, MsgEventsDropped,
		slog.String(diagnostics.KeyJobID, s.cfg.JobID),
		slog.String(diagnostics.KeyAttemptID, s.cfg.Attempt.AttemptID),
		slog.Int64(keyDropped, dropped),
	)
}

func (s *Session) recordTurnFailed(stage, class string) {
	s.log.LogAttrs(context.Background(), slog.LevelError, MsgTurnFailed,
		slog.String(diagnostics.KeyJobID, s.cfg.JobID),
		slog.String(diagnostics.KeyAttemptID, s.cfg.Attempt.AttemptID),
		slog.String(keyStage, stage),
		slog.String(diagnostics.KeyClass, class),
	)
}
