package controlplane

import (
	"context"
	"log/slog"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
)

// reapBatch bounds one sweep so that a backlog cannot hold the writer long.
const reapBatch = 1000

// RunReaper runs the reaper on the caller's goroutine until ctx is done,
// then returns nil. Each sweep first gives every running lease a full TTL
// if the control plane itself was away (P4), then supersedes the attempts
// whose lease expired more than ReaperGrace ago (P3, R30, R35, P6). A
// failed sweep is recorded and tried again at the next tick.
func (s *Server) RunReaper(ctx context.Context) error {
	t := time.NewTicker(s.cfg.ReaperInterval)
	defer t.Stop()
	for {
		s.Sweep(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// minAbsence is the shortest gap between sweeps that counts as the control
// plane's own absence, so that a slow sweep on a busy machine with a short
// interval does not hand every lease a new TTL.
const minAbsence = 10 * time.Second

// absence is the gap between two sweeps that counts as the control plane's
// own absence (P4).
func (s *Server) absence() time.Duration { return max(3*s.cfg.ReaperInterval, minAbsence) }

// Sweep is one reaper pass (RunReaper calls it every interval).
func (s *Server) Sweep(ctx context.Context) {
	now := s.cfg.Now()
	n, err := s.cfg.Store.ResumeAfterAbsence(ctx, now, s.absence())
	if err != nil {
		s.sweepFailed(ctx, "resume_after_absence", err)
		return
	}
	if n > 0 {
		s.log.LogAttrs(ctx, slog.LevelWarn, "controlplane_leases_resumed",
			slog.Int("leases", n), slog.Duration("absence_over", s.absence()))
	}
	for {
		res, err := s.cfg.Store.Reap(ctx, store.ReapParams{
			Now: now, Grace: s.cfg.ReaperGrace, MaxWorkerLost: s.cfg.MaxWorkerLost, Limit: reapBatch,
		})
		if err != nil {
			s.sweepFailed(ctx, "reap", err)
			return
		}
		if res == (store.ReapResult{}) {
			return
		}
		s.log.LogAttrs(ctx, slog.LevelInfo, "controlplane_reaped",
			slog.Int("superseded", res.Superseded), slog.Int("requeued", res.Requeued),
			slog.Int("conversations_lost", res.ConversationsLost),
			slog.Int("failed_worker_lost_cap", res.FailedWorkerLostCap))
		if res.Superseded < reapBatch {
			return
		}
	}
}

func (s *Server) sweepFailed(ctx context.Context, stage string, err error) {
	if ctx.Err() != nil {
		return // shutting down
	}
	s.log.LogAttrs(ctx, slog.LevelError, "controlplane_reaper_failed",
		slog.String("stage", stage), slog.String("class", errorClass(err)))
}
