package settlement

import (
	"context"

	"github.com/runnerd/runnerd/diagnostics"
)

func (s *Session) attempt() diagnostics.Attempt {
	return diagnostics.Attempt{JobID: s.cfg.JobID, AttemptID: s.cfg.Attempt.AttemptID}
}

// recordControlFailure writes one agent_control_failure for a failed try;
// err is a *wire.StatusError or a transport error, classified by diagnostics.
func (s *Session) recordControlFailure(op string, err error) {
	s.rec.ControlFailure(context.Background(), op, s.attempt(), err)
}
