package sqlstore

import (
	"context"
	"fmt"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// ListJobs lists the jobs f selects, newest first (queue order reversed),
// each with its attempts and without its events. It reads the ids in one
// statement and each job as GetJob does, so a listed job reads the same
// as its own page.
func (s *Store) ListJobs(ctx context.Context, f store.JobFilter) ([]wire.Job, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = store.DefaultJobListLimit
	}
	query := `SELECT j.id FROM jobs j WHERE 1 = 1`
	var args []any
	if f.State != "" {
		query += ` AND j.state = ?`
		args = append(args, f.State)
	}
	if f.ConversationID != "" {
		query += ` AND j.conversation_id = ?`
		args = append(args, f.ConversationID)
	}
	if f.Host != "" {
		query += ` AND EXISTS (SELECT 1 FROM attempts a WHERE a.job_id = j.id AND a.lease_owner = ?)`
		args = append(args, f.Host)
	}
	query += ` ORDER BY j.pos DESC LIMIT ?`
	args = append(args, limit)
	rows, err := s.r.QueryContext(ctx, s.q(query), args...)
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, fmt.Errorf("list jobs: %w", err)
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	out := make([]wire.Job, 0, len(ids))
	for _, id := range ids {
		j, err := s.getJob(ctx, s.r, id)
		if err != nil {
			return nil, fmt.Errorf("list jobs: %w", err)
		}
		out = append(out, j)
	}
	return out, nil
}
