package sqlstore

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// A worker's call in one statement: the worker token's hash, the job, the
// attempt, its generation and its lease, all in the WHERE of one guarded
// statement that returns what the answer needs, with the clock read inside
// it (nowSQL). On PostgreSQL it runs outside any transaction: one round
// trip, no BEGIN/COMMIT around it. When it changes nothing, the call falls
// back to the ordinary path (AuthorizeAttempt, then the guarded write in a
// transaction), which words the refusal and records the stale report.

// one runs a single statement that is its own transaction: on the
// PostgreSQL pool directly (autocommit), through SQLite's single writer.
func (s *Store) one(ctx context.Context, fn func(tx txn) error) (err error) {
	if s.d == sqlite {
		return s.write(ctx, fn)
	}
	if obs := s.cfg.txObserver; obs != nil {
		defer func(start time.Time) { obs(time.Since(start), err) }(time.Now())
	}
	return fn(s.w)
}

// refusedAs explains a worker's call that changed nothing by the ordinary
// path's answers: the token's (AuthorizeAttempt), ErrOtherAttempt, or
// nil with the time to run the guarded write at, in a transaction, for
// its own verdict.
func (s *Store) refusedAs(ctx context.Context, w store.Worker, ref wire.AttemptRef, now time.Time) (time.Time, error) {
	auth, err := s.AuthorizeAttempt(ctx, w.JobID, w.TokenHash)
	if err != nil {
		return now, err
	}
	if auth.AttemptID != ref.AttemptID {
		return now, store.ErrOtherAttempt
	}
	if now.IsZero() {
		return s.Now(ctx)
	}
	return now, nil
}

// RecordSandboxStates records what the host said of its sandboxes'
// states (S1): each conversation's, only while its sandbox is recorded on
// that host (a record that moved is the new host's to report).
func (s *Store) RecordSandboxStates(ctx context.Context, hostID string, states map[string]string) error {
	if len(states) == 0 {
		return nil
	}
	ids := make([]string, 0, len(states))
	for id, st := range states {
		if st != wire.SandboxRunning && st != wire.SandboxStopped {
			return fmt.Errorf("record sandbox states: %w: state %q", store.ErrInvalid, st)
		}
		ids = append(ids, id)
	}
	slices.Sort(ids) // one lock order for concurrent writers
	err := s.write(ctx, func(tx txn) error {
		for _, id := range ids {
			if _, err := s.exec(ctx, tx, `UPDATE conversations SET sandbox_state = ? WHERE id = ? AND sandbox_host_id = ?`,
				states[id], id, hostID); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("record sandbox states: %w", err)
	}
	return nil
}

// ConversationStates reads many conversations' states in one query: on
// PostgreSQL the ids as one array parameter, on SQLite as one JSON array.
func (s *Store) ConversationStates(ctx context.Context, ids []string) (map[string]store.ConversationState, error) {
	out := make(map[string]store.ConversationState, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	const cols = `SELECT c.id, c.state, COALESCE(c.sandbox_host_id, ''), COALESCE(h.name, ''), c.sandbox_state` + conversationFrom
	q, arg := cols+` WHERE c.id = ANY($1)`, any(ids)
	if s.d == sqlite {
		b, err := json.Marshal(ids)
		if err != nil {
			return nil, fmt.Errorf("conversation states: %w", err)
		}
		q, arg = cols+` WHERE c.id IN (SELECT value FROM json_each(?))`, string(b)
	}
	rows, err := s.r.QueryContext(ctx, q, arg)
	if err != nil {
		return nil, fmt.Errorf("conversation states: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var c store.ConversationState
		if err := rows.Scan(&id, &c.State, &c.SandboxHostID, &c.SandboxHost, &c.SandboxState); err != nil {
			return nil, fmt.Errorf("conversation states: %w", err)
		}
		out[id] = c
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("conversation states: %w", err)
	}
	return out, nil
}
