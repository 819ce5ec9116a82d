package sqlstore

import (
	"context"
	"fmt"

	"github.com/runnerd/runnerd/controlplane/store"
)

// reclaimBatch bounds one reclamation transaction, so that a backlog does
// not hold SQLite's writer for long.
const reclaimBatch = 100

// reclaimQuery picks ended jobs whose detail remains, oldest end first: an
// ordered walk of jobs_reclaim (TestQueryPlansUseIndexes).
const reclaimQuery = `SELECT id FROM jobs WHERE ended_at < ? AND detail_reclaimed_at IS NULL ORDER BY ended_at LIMIT ?`

// ReclaimDetail reclaims the bulky detail of jobs that ended before
// p.Before (P8): the prompt, the worker token hashes of their attempts (a
// value no hash can equal takes their place, so the column stays unique),
// the stored terminal reports with their reason text, and the data of
// runner events and of the finished and abandoned events that carried the
// runner's report. The rows, counts, states, outcomes, the plain-language
// reason and every event's type and time stay.
func (s *Store) ReclaimDetail(ctx context.Context, p store.ReclaimParams) (int, error) {
	total := 0
	for p.Limit <= 0 || total < p.Limit {
		n := reclaimBatch
		if p.Limit > 0 && p.Limit-total < n {
			n = p.Limit - total
		}
		var done int
		err := s.write(ctx, func(tx txn) error {
			done = 0
			ended, err := ids(ctx, tx, s.q(reclaimQuery+s.lockSkip()), ns(p.Before), n)
			if err != nil {
				return err
			}
			for _, id := range ended {
				if err := s.reclaim(ctx, tx, id, p); err != nil {
					return err
				}
			}
			done = len(ended)
			return nil
		})
		if err != nil {
			return total, fmt.Errorf("reclaim detail: %w", err)
		}
		total += done
		if done < n {
			break
		}
	}
	return total, nil
}

func (s *Store) reclaim(ctx context.Context, tx txn, jobID string, p store.ReclaimParams) error {
	n, err := s.exec(ctx, tx, `UPDATE jobs SET prompt = '', detail_reclaimed_at = ?
		WHERE id = ? AND ended_at < ? AND detail_reclaimed_at IS NULL`, ns(p.Now), jobID, ns(p.Before))
	if err != nil || n == 0 {
		return err
	}
	if _, err := s.exec(ctx, tx, `UPDATE attempts SET token_hash = 'reclaimed:' || id, report = '' WHERE job_id = ?`, jobID); err != nil {
		return err
	}
	_, err = s.exec(ctx, tx, `UPDATE job_events SET data = '' WHERE job_id = ? AND data <> ''
		AND (source = 'runner' OR type IN ('finished', 'abandoned'))`, jobID)
	return err
}
