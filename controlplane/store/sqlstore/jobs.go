package sqlstore

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// ListJobs lists the jobs f selects, newest first (queue order reversed),
// each with its attempts and without its events, and the cursor of the
// page after. It reads the ids in one statement and each job as GetJob
// does, so a listed job reads the same as its own page.
func (s *Store) ListJobs(ctx context.Context, f store.JobFilter) (store.JobList, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = store.DefaultJobListLimit
	}
	query := `SELECT j.id, j.pos FROM jobs j WHERE 1 = 1`
	var args []any
	if f.State != "" {
		query += ` AND j.state = ?`
		args = append(args, f.State)
	}
	if f.Outcome != "" {
		query += ` AND j.outcome = ?`
		args = append(args, f.Outcome)
	}
	if f.Class != "" {
		if !classRE.MatchString(f.Class) {
			return store.JobList{}, fmt.Errorf("list jobs: class %q is not letters, digits and _", f.Class)
		}
		// The class is in the report's event as the runner sent it; the
		// pattern has no wildcard of its own (checked above).
		query += ` AND EXISTS (SELECT 1 FROM job_events e WHERE e.job_id = j.id
			AND e.type IN ('finished', 'abandoned', 'released') AND e.data LIKE ?)`
		args = append(args, `%"class":"`+f.Class+`"%`)
	}
	if f.ConversationID != "" {
		query += ` AND j.conversation_id = ?`
		args = append(args, f.ConversationID)
	}
	if f.Host != "" {
		query += ` AND EXISTS (SELECT 1 FROM attempts a WHERE a.job_id = j.id AND a.lease_owner = ?)`
		args = append(args, f.Host)
	}
	if !f.Since.IsZero() {
		query += ` AND j.created_at >= ?`
		args = append(args, ns(f.Since))
	}
	if f.Before > 0 {
		query += ` AND j.pos < ?`
		args = append(args, f.Before)
	}
	// One more than asked says whether a next page exists.
	query += ` ORDER BY j.pos DESC LIMIT ?`
	args = append(args, limit+1)
	rows, err := s.r.QueryContext(ctx, s.q(query), args...)
	if err != nil {
		return store.JobList{}, fmt.Errorf("list jobs: %w", err)
	}
	var ids []string
	var poss []int64
	for rows.Next() {
		var id string
		var pos int64
		if err := rows.Scan(&id, &pos); err != nil {
			rows.Close()
			return store.JobList{}, fmt.Errorf("list jobs: %w", err)
		}
		ids, poss = append(ids, id), append(poss, pos)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return store.JobList{}, fmt.Errorf("list jobs: %w", err)
	}
	var l store.JobList
	if len(ids) > limit {
		ids, l.Next = ids[:limit], poss[limit-1]
	}
	l.Jobs = make([]wire.Job, 0, len(ids))
	for _, id := range ids {
		j, err := s.getJob(ctx, s.r, id)
		if err != nil {
			return store.JobList{}, fmt.Errorf("list jobs: %w", err)
		}
		l.Jobs = append(l.Jobs, j)
	}
	return l, nil
}

// classRE is an error class as runners name them (wire.Class*, diagnostics).
var classRE = regexp.MustCompile(`^[A-Za-z0-9_]+$`)

// ConversationTitles reads the titles of the conversations ids names in
// one query; an id the store does not hold has no entry.
func (s *Store) ConversationTitles(ctx context.Context, ids []string) (map[string]string, error) {
	out := make(map[string]string, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	q, arg := `SELECT id, title FROM conversations WHERE id = ANY($1)`, any(ids)
	if s.d == sqlite {
		b, err := json.Marshal(ids)
		if err != nil {
			return nil, fmt.Errorf("conversation titles: %w", err)
		}
		q, arg = `SELECT id, title FROM conversations WHERE id IN (SELECT value FROM json_each(?))`, string(b)
	}
	rows, err := s.r.QueryContext(ctx, q, arg)
	if err != nil {
		return nil, fmt.Errorf("conversation titles: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, title string
		if err := rows.Scan(&id, &title); err != nil {
			return nil, fmt.Errorf("conversation titles: %w", err)
		}
		out[id] = title
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("conversation titles: %w", err)
	}
	return out, nil
}

// RunningTurns reads every running attempt with its job's turn number and
// the name of the host holding its lease, in one query, by host name and
// then oldest claim first: the attempts ListServers counts as a host's
// running turns.
func (s *Store) RunningTurns(ctx context.Context) ([]store.RunningTurn, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT a.job_id, j.seq, h.name, a.claimed_at
		FROM attempts a JOIN jobs j ON j.id = a.job_id JOIN hosts h ON h.id = a.host_id
		WHERE a.state = 'running' ORDER BY h.name, a.claimed_at, a.job_id`)
	if err != nil {
		return nil, fmt.Errorf("running turns: %w", err)
	}
	defer rows.Close()
	out := []store.RunningTurn{}
	for rows.Next() {
		var t store.RunningTurn
		var claimed int64
		if err := rows.Scan(&t.JobID, &t.Seq, &t.Host, &claimed); err != nil {
			return nil, fmt.Errorf("running turns: %w", err)
		}
		t.ClaimedAt = fromNS(claimed)
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("running turns: %w", err)
	}
	return out, nil
}
