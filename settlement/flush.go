package settlement

import "context"

// FlushEvents closes the event buffer and gives pending events up to
// EventsConfig.Flush to reach the control plane. A turn child calls it
// before it hands its terminal report to the daemon, which sends the
// report on the child's behalf; Finish does the same on its own.
func (s *Session) FlushEvents(ctx context.Context) { s.ev.flush(ctx) }
