package sqlstore

import (
	"context"
	"database/sql"
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
	cutoff := ns(p.Now) - int64(p.Grace)
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
		total.ConversationsLost += res.ConversationsLost
		total.FailedWorkerLostCap += res.FailedWorkerLostCap
		if picked < n {
			break
		}
	}
	return total, nil
}

func (s *Store) supersede(ctx context.Context, tx txn, id string, cutoff int64, maxLost int, now time.Time, res *store.ReapResult) error {
	var jobID, owner string
	var gen, exp int64
	var admitted sql.NullInt64
	err := tx.QueryRowContext(ctx, s.q(`UPDATE attempts SET state = 'superseded', ended_at = ?,
		counts_as_attempt = CASE WHEN admitted_at IS NULL THEN 0 ELSE counts_as_attempt END
		WHERE id = ? AND state = 'running' AND lease_expires_at < ?
		RETURNING job_id, generation, lease_owner, lease_expires_at, admitted_at`), ns(now), id, cutoff).Scan(
		&jobID, &gen, &owner, &exp, &admitted)
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
	if !admitted.Valid {
		state, err := s.requeueLost(ctx, tx, jobID, id, maxLost, now)
		switch state {
		case wire.JobQueued:
			res.Requeued++
		case wire.JobFailed:
			res.FailedWorkerLostCap++
		}
		return err
	}
	// R30, R35: the prompt may have reached the agent; never replayed.
	var conv string
	if err := tx.QueryRowContext(ctx, s.q(`SELECT conversation_id FROM jobs WHERE id = ?`), jobID).Scan(&conv); err != nil {
		return err
	}
	if err := s.loseConversation(ctx, tx, conv, reasonLostHostSilent, now); err != nil {
		return err
	}
	res.ConversationsLost++
	return s.endJob(ctx, tx, jobID, conv, wire.JobFailed, wire.OutcomeFailed, reasonLostHostSilent, now)
}

// ResumeAfterAbsence gives every running lease a full TTL from now when the
// control plane has not been seen for longer than maxGap (P4), and records
// now as its last sign of life.
func (s *Store) ResumeAfterAbsence(ctx context.Context, now time.Time, maxGap time.Duration) (int, error) {
	var extended int64
	err := s.write(ctx, func(tx txn) error {
		extended = 0
		var last int64
		err := tx.QueryRowContext(ctx, `SELECT last_seen FROM control_plane WHERE id = 1`+s.lockRow()).Scan(&last)
		if err != nil && err != sql.ErrNoRows {
			return err
		}
		if err == nil && ns(now)-last > int64(maxGap) {
			if _, err := s.exec(ctx, tx, `INSERT INTO job_events (job_id, attempt_id, time, source, type, data)
				SELECT job_id, id, ?, 'control', 'lease_extended_after_absence', '' FROM attempts
				WHERE state = 'running' AND lease_expires_at < ? + lease_ttl`, ns(now), ns(now)); err != nil {
				return err
			}
			extended, err = s.exec(ctx, tx, `UPDATE attempts SET lease_expires_at = ? + lease_ttl
				WHERE state = 'running' AND lease_expires_at < ? + lease_ttl`, ns(now), ns(now))
			if err != nil {
				return err
			}
		}
		_, err = s.exec(ctx, tx, `INSERT INTO control_plane (id, last_seen) VALUES (1, ?)
			ON CONFLICT (id) DO UPDATE SET last_seen = excluded.last_seen`, ns(now))
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("resume after absence: %w", err)
	}
	return int(extended), nil
}
