package controlplane

import (
	"context"
	"log/slog"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
)

// reapBatch bounds one sweep so that a backlog cannot hold the writer long.
const reapBatch = 1000

// reclaimBatch bounds the jobs one sweep reclaims the detail of (P8); a
// backlog drains over the next sweeps.
const reclaimBatch = 1000

// RunReaper runs the reaper on the caller's goroutine until ctx is done,
// then returns nil. Each sweep first ends the control plane's own absence
// (P4, K3), then supersedes the attempts whose lease expired more than
// ReaperGrace ago (P3, R30, R35, P6, K2), then reclaims the detail of jobs
// that ended more than Retention ago (P8). A failed sweep is recorded and
// tried again at the next tick. `controlplane serve` calls Resume before
// it accepts a request, so the first request after a restart meets leases
// that were resumed already.
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

// minAbsence is the shortest gap in the record of sweeps that counts as
// the control plane's own absence, so that a slow sweep on a busy machine
// with a short interval does not hand every lease a new TTL.
const minAbsence = 10 * time.Second

// absence is the gap in the database's record of sweeps that counts as the
// control plane's own absence (P4).
func (s *Server) absence() time.Duration { return max(3*s.cfg.ReaperInterval, minAbsence) }

// Sweep is one reaper pass (RunReaper calls it every interval).
func (s *Server) Sweep(ctx context.Context) {
	now, err := s.resume(ctx)
	if err != nil {
		s.sweepFailed(ctx, "resume_after_absence", err)
		return
	}
	if s.reap(ctx, now) {
		s.reclaim(ctx, now)
	}
	// Routing: judged against the hosts online now, so a
	// turn no live host can take says so on its job, and stops saying so
	// at the first sweep after a host that can take it heartbeats.
	if _, err := s.cfg.Store.SweepRoutes(ctx, now); err != nil {
		s.sweepFailed(ctx, "sweep_routes", err)
	}
}

// Resume ends the control plane's own absence, if the database's record
// shows one, before the server serves (P4, K3).
func (s *Server) Resume(ctx context.Context) error {
	_, err := s.resume(ctx)
	return err
}

// resume reads the store's clock, gives every lease a full TTL if the
// record of sweeps shows an absence, records this sweep, and returns the
// time it judged on.
func (s *Server) resume(ctx context.Context) (time.Time, error) {
	now, err := s.cfg.Store.Now(ctx)
	if err != nil {
		return now, err
	}
	n, err := s.cfg.Store.ResumeAfterAbsence(ctx, now, s.absence())
	if err != nil {
		return now, err
	}
	if n > 0 {
		s.log.LogAttrs(ctx, slog.LevelWarn, MsgLeasesResumed,
			slog.Int("leases", n), slog.Duration("absence_over", s.absence()))
	}
	return now, nil
}

// reap supersedes expired attempts; false if the sweep failed.
func (s *Server) reap(ctx context.Context, now time.Time) bool {
	for {
		res, err := s.cfg.Store.Reap(ctx, store.ReapParams{
			Now: now, Grace: s.cfg.ReaperGrace, MaxWorkerLost: s.cfg.MaxWorkerLost, Limit: reapBatch,
		})
		if err != nil {
			s.sweepFailed(ctx, "reap", err)
			return false
		}
		if res == (store.ReapResult{}) {
			return true
		}
		s.cfg.Metrics.reap(res)
		s.log.LogAttrs(ctx, slog.LevelInfo, MsgReaped,
			slog.Int("superseded", res.Superseded), slog.Int("requeued", res.Requeued),
			slog.Int("conversations_quarantined", res.ConversationsQuarantined), slog.Int("reports_missing", res.ReportsMissing),
			slog.Int("failed_worker_lost_cap", res.FailedWorkerLostCap))
		if res.Superseded < reapBatch {
			return true
		}
	}
}

// reclaim reclaims the detail of jobs past the retention window, at most
// reclaimBatch of them (P8).
func (s *Server) reclaim(ctx context.Context, now time.Time) {
	if s.cfg.Retention < 0 {
		return
	}
	n, err := s.cfg.Store.ReclaimDetail(ctx, store.ReclaimParams{Now: now, Before: now.Add(-s.cfg.Retention), Limit: reclaimBatch})
	if err != nil {
		s.sweepFailed(ctx, "reclaim_detail", err)
		return
	}
	if n > 0 {
		s.log.LogAttrs(ctx, slog.LevelInfo, MsgDetailReclaimed,
			slog.Int("jobs", n), slog.Duration("retention", s.cfg.Retention))
	}
}

func (s *Server) sweepFailed(ctx context.Context, stage string, err error) {
	if ctx.Err() != nil {
		return // shutting down
	}
	s.log.LogAttrs(ctx, slog.LevelError, MsgReaperFailed,
		slog.String("stage", stage), slog.String("class", errorClass(err)))
}
