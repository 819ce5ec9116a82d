package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// reapBatch bounds one reaper transaction, so that a long sweep does not
// hold SQLite's writer for long.
const reapBatch = 256

// Reap supersedes attempts whose lease expired more than Grace before Now
// (P3). Each is one guarded UPDATE, so a finish racing it either lands
// first (and the reaper skips the attempt) or is refused as stale.
func (s *Store) Reap(ctx context.Context, p store.ReapParams) (store.ReapResult, error) {
	maxLost := p.MaxWorkerLost
	if maxLost <= 0 {
		maxLost = s.cfg.maxWorkerLost
	}
	var total store.ReapResult
	for p.Limit <= 0 || total.Superseded < p.Limit {
		n := reapBatch
		if p.Limit > 0 && p.Limit-total.Superseded < n {
			n = p.Limit - total.Superseded
		}
		var res store.ReapResult
		var picked int
		err := s.write(ctx, func(tx txn) error {
			res, picked = store.ReapResult{}, 0
			cutoff := ns(p.Now) - int64(p.Grace)
			// K3: an expiry inside an absence no sweep has resumed is the
			// control plane's, not the worker's.
			if last, absent, err := s.absence(ctx, tx, p.Now, false); err != nil {
				return err
			} else if absent {
				cutoff = min(cutoff, last)
			}
			expired, err := ids(ctx, tx, s.q(`SELECT id FROM attempts WHERE state = 'running' AND lease_expires_at < ?
				ORDER BY lease_expires_at LIMIT ?`+s.lockSkip()), cutoff, n)
			if err != nil {
				return err
			}
			picked = len(expired)
			for _, id := range expired {
				if err := s.supersede(ctx, tx, id, cutoff, maxLost, p.Now, &res); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return total, fmt.Errorf("reap: %w", err)
		}
		total.Superseded += res.Superseded
		total.Requeued += res.Requeued
		total.ConversationsQuarantined += res.ConversationsQuarantined
		total.FailedWorkerLostCap += res.FailedWorkerLostCap
		total.ReportsMissing += res.ReportsMissing
		if picked < n {
			break
		}
	}
	return total, nil
}

func (s *Store) supersede(ctx context.Context, tx txn, id string, cutoff int64, maxLost int, now time.Time, res *store.ReapResult) error {
	var jobID, owner string
	var gen, exp int64
	var admitted, settled sql.NullInt64
	var interrupted int64
	// P6: a host lost before settlement is not an attempt of the job; a
	// settled turn completed (K2) and counts.
	err := tx.QueryRowContext(ctx, s.q(`UPDATE attempts SET state = 'superseded', ended_at = ?,
		counts_as_attempt = CASE WHEN settled_at IS NULL THEN 0 ELSE counts_as_attempt END,
		outcome = CASE WHEN settled_at IS NULL THEN outcome ELSE ? END
		WHERE id = ? AND state = 'running' AND lease_expires_at < ?
		RETURNING job_id, generation, lease_owner, lease_expires_at, admitted_at, settled_at, settled_interrupted`),
		ns(now), wire.OutcomeReportMissing, id, cutoff).Scan(&jobID, &gen, &owner, &exp, &admitted, &settled, &interrupted)
	if err == sql.ErrNoRows {
		return nil // finished or renewed meanwhile
	}
	if err != nil {
		return err
	}
	res.Superseded++
	// R20: this says the lease ended, not that another attempt ran.
	if err := s.event(ctx, tx, jobID, id, now, "attempt_superseded", map[string]any{
		"lease_generation": gen, "lease_owner": owner, "lease_expires_at": fromNS(exp), "admitted": admitted.Valid,
	}); err != nil {
		return err
	}
	// S5: the job this ends names why, from the host's heartbeats.
	cause, lost, err := s.silentCause(ctx, tx, owner, gen, exp, now)
	if err != nil {
		return err
	}
	if !admitted.Valid {
		state, err := s.requeueLost(ctx, tx, jobID, id, maxLost, now)
		if err == nil {
			err = s.setCause(ctx, tx, jobID, cause, lost)
		}
		switch state {
		case wire.JobQueued:
			res.Requeued++
		case wire.JobFailed:
			res.FailedWorkerLostCap++
		}
		return err
	}
	var conv string
	if err := tx.QueryRowContext(ctx, s.q(`SELECT conversation_id FROM jobs WHERE id = ?`), jobID).Scan(&conv); err != nil {
		return err
	}
	if settled.Valid {
		// K2: the settlement is recorded, so the turn completed for its
		// conversation at that boundary; only the runner's final report
		// went missing. The conversation stays usable and its next turn
		// runs from the recorded boundary.
		res.ReportsMissing++
		if interrupted != 0 {
			// K10: the boundary is an interrupt on the user's cancel.
			return s.endJob(ctx, tx, jobID, conv, wire.JobCancelled, wire.OutcomeCancelled, reasonInterruptedByUser, now)
		}
		return s.endJob(ctx, tx, jobID, conv, wire.JobSucceeded, wire.OutcomeReportMissing, reasonReportMissing, now)
	}
	// P6: the host was lost, which the counts say; it is not an attempt.
	if _, err := s.exec(ctx, tx, `UPDATE jobs SET worker_lost_count = worker_lost_count + 1, attempt_count = attempt_count - 1
		WHERE id = ?`, jobID); err != nil {
		return err
	}
	// R30, R35: the prompt may have reached the agent; never replayed. K13:
	// the conversation is quarantined, not lost; the attempt is fenced by
	// this supersede and its supervisor token by the next activation.
	if err := s.quarantine(ctx, tx, conv, jobID, now); err != nil {
		return err
	}
	res.ConversationsQuarantined++
	if err := s.endJob(ctx, tx, jobID, conv, wire.JobFailed, wire.OutcomeFailed, reasonInterruptedHostSilent, now); err != nil {
		return err
	}
	return s.setCause(ctx, tx, jobID, cause, lost)
}

// silentCause is why an attempt's lease expired with no report (S5): the
// host still heartbeats (it is online as Admin → Servers judges it), so
// the attempt's renewals did not get through and it fenced itself, writing
// nothing more (K5, R8) — lease_fenced; or the host went silent too —
// host_lost.
func (s *Store) silentCause(ctx context.Context, tx txn, owner string, gen, exp int64, now time.Time) (wire.Cause, string, error) {
	var last sql.NullInt64
	var everyMS int64
	err := tx.QueryRowContext(ctx, s.q(`SELECT last_heartbeat, heartbeat_interval_ms FROM hosts WHERE name = ?`), owner).Scan(&last, &everyMS)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return "", "", err
	}
	lease := fmt.Sprintf("the lease of host %s (generation %d) expired at %s with no report", owner, gen, fromNS(exp).Format(time.RFC3339Nano))
	if !last.Valid {
		return wire.CauseHostLost, lease + "; the host never heartbeated", nil
	}
	srv := wire.Server{LastHeartbeat: nsPtr(last), HeartbeatIntervalMS: everyMS}
	heard := "; its last heartbeat " + fromNS(last.Int64).Format(time.RFC3339Nano)
	if wire.HostState(srv, now) != wire.HostOffline {
		return wire.CauseLeaseFenced, lease + " while the host still heartbeated" + heard + ": its renewals did not get through, and the fenced attempt writes nothing more", nil
	}
	return wire.CauseHostLost, lease + heard, nil
}

// ResumeAfterAbsence ends the control plane's own absence (P4, K3): when
// the database's record of its last sign of life is older than maxGap on
// the store's clock, every running lease that had not expired before the
// absence began gets a full TTL from now. It records now (never moving the
// record back: replicas' sweeps interleave) and maxGap, which the guarded
// statements read to accept what arrives before this runs.
func (s *Store) ResumeAfterAbsence(ctx context.Context, now time.Time, maxGap time.Duration) (int, error) {
	var extended int64
	err := s.write(ctx, func(tx txn) error {
		extended = 0
		last, absent, err := s.absence(ctx, tx, now, true)
		if err != nil {
			return err
		}
		if !absent && last > 0 && ns(now)-last > int64(maxGap) {
			absent = true // the first sweep that names a gap
		}
		if absent {
			const resumed = `state = 'running' AND lease_expires_at > ? AND lease_expires_at < ? + lease_ttl`
			if err := s.events(ctx, tx, `SELECT job_id, id FROM attempts WHERE `+resumed, []any{last, ns(now)},
				now, "lease_extended_after_absence", nil); err != nil {
				return err
			}
			extended, err = s.exec(ctx, tx, `UPDATE attempts SET lease_expires_at = ? + lease_ttl WHERE `+resumed,
				ns(now), last, ns(now))
			if err != nil {
				return err
			}
		}
		_, err = s.exec(ctx, tx, `INSERT INTO control_plane (id, last_seen, max_gap) VALUES (1, ?, ?)
			ON CONFLICT (id) DO UPDATE SET max_gap = excluded.max_gap,
			last_seen = CASE WHEN excluded.last_seen > control_plane.last_seen THEN excluded.last_seen ELSE control_plane.last_seen END`,
			ns(now), int64(maxGap))
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("resume after absence: %w", err)
	}
	return int(extended), nil
}
