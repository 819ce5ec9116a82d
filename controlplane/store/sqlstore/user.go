package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// Plain-language reasons shown to the conversation's owner (R32). The
// infrastructure detail stays in the job's events.
const (
	reasonLostSession = "This conversation is no longer available: its saved working state could not be found, so it cannot be continued."
	// K13: a quarantined conversation whose retained sandbox failed the
	// next turn's verification.
	reasonLostUnverified  = "This conversation is no longer available: a reply was interrupted, and its saved working state is no longer the one that reply left, so it cannot be safely continued."
	reasonLostHostRetired = "This conversation is no longer available: the computer that kept its working state was taken out of service."
	reasonQueuedLost      = "This message was not answered because the conversation is no longer available."
	// K10: the user's cancel interrupted a running reply, which was kept.
	reasonInterruptedByUser = "The reply was interrupted at your request. The conversation continues from where it stopped."
	// K13: an admitted turn that ended without a recorded settlement; its
	// conversation is quarantined, not lost.
	reasonInterrupted           = "This reply was interrupted before it finished, and what it did may be incomplete. Your next message continues the conversation."
	reasonInterruptedHostSilent = "This reply was interrupted: the computer working on it stopped responding before it finished, and what it did may be incomplete. Your next message continues the conversation."
	reasonCancelled             = "Cancelled."
	reasonFailed                = "The reply failed."
	reasonNotStarted            = "The reply could not be started."
	// K2: the turn settled, its host never sent the final report.
	reasonReportMissing = "The reply was completed and saved, but the computer that ran it stopped before confirming it. The conversation continues from this reply."
	reasonWorkerLostCap = "This message could not be answered: the computers that tried to run it stopped responding %d times."
	// K7: the count and the last release's class (e.g. declined:agent_missing).
	reasonReleaseCap = "This message could not be started: the computers that tried could not launch it %d times (last: %s)."
)

// conversationCols reads a conversation with the name of its sandbox's
// host (FROM conversationFrom).
const conversationCols = `c.id, c.title, c.image, c.agent_command, c.state, c.lost_reason, c.container_id, c.epoch, c.native_turn,
	c.created_at, COALESCE(h.name, ''), c.requires, c.interrupted_job_id, c.agent_protocol, c.permission_policy, c.sandbox_state, c.limits`

const conversationFrom = ` FROM conversations c LEFT JOIN hosts h ON h.id = c.sandbox_host_id`

func scanConversation(sc interface{ Scan(...any) error }) (wire.Conversation, error) {
	var c wire.Conversation
	var cmd, requires, limits string
	var created int64
	if err := sc.Scan(&c.ID, &c.Title, &c.Image, &cmd, &c.State, &c.LostReason, &c.ContainerID, &c.Epoch, &c.NativeTurn,
		&created, &c.SandboxHost, &requires, &c.InterruptedJobID, &c.AgentProtocol, &c.PermissionPolicy, &c.SandboxState, &limits); err != nil {
		return c, err
	}
	var err error
	if c.Limits, err = decodeLimits(limits); err != nil {
		return c, err
	}
	if requires != "" {
		var err error
		if c.Requires, err = wire.ParseLabels(requires); err != nil {
			return c, fmt.Errorf("decode requires: %w", err)
		}
	}
	if err := json.Unmarshal([]byte(cmd), &c.AgentCommand); err != nil {
		return c, fmt.Errorf("decode agent command: %w", err)
	}
	c.CreatedAt = fromNS(created)
	return c, nil
}

// CreateConversation stores a new, usable conversation.
func (s *Store) CreateConversation(ctx context.Context, req wire.CreateConversationRequest, now time.Time) (wire.Conversation, error) {
	if len(req.AgentCommand) == 0 || req.AgentCommand[0] == "" {
		return wire.Conversation{}, fmt.Errorf("create conversation: %w: agent_command is required", store.ErrInvalid)
	}
	requires, err := requirements(req)
	if err != nil {
		return wire.Conversation{}, fmt.Errorf("create conversation: %w: %w", store.ErrInvalid, err)
	}
	protocol, policy, err := wire.CheckAgentProtocol(req.AgentProtocol, req.PermissionPolicy)
	if err != nil {
		return wire.Conversation{}, fmt.Errorf("create conversation: %w: %w", store.ErrInvalid, err)
	}
	if err := wire.CheckLimits(req.Limits, requires[wire.LabelSandbox]); err != nil {
		if errors.Is(err, wire.ErrLimitUnsupported) {
			return wire.Conversation{}, fmt.Errorf("create conversation: %w", err)
		}
		return wire.Conversation{}, fmt.Errorf("create conversation: %w: %w", store.ErrInvalid, err)
	}
	limits, err := encodeLimits(req.Limits)
	if err != nil {
		return wire.Conversation{}, fmt.Errorf("create conversation: %w", err)
	}
	cmd, err := json.Marshal(req.AgentCommand)
	if err != nil {
		return wire.Conversation{}, fmt.Errorf("create conversation: %w", err)
	}
	c := wire.Conversation{
		ID: newID("conv"), Title: req.Title, Image: req.Image, AgentCommand: req.AgentCommand,
		State: wire.ConversationUsable, CreatedAt: fromNS(ns(now)), Requires: requires,
		AgentProtocol: protocol, PermissionPolicy: policy, Limits: req.Limits,
	}
	route := requires.String()
	err = s.write(ctx, func(tx txn) error {
		if err := s.ensureRoute(ctx, tx, route, requires); err != nil {
			return err
		}
		_, err := s.exec(ctx, tx, `INSERT INTO conversations (id, title, image, agent_command, state, created_at, updated_at, requires,
			agent_protocol, permission_policy, limits)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, c.ID, c.Title, c.Image, string(cmd), c.State, ns(now), ns(now), route,
			c.AgentProtocol, c.PermissionPolicy, limits)
		return err
	})
	if err != nil {
		return wire.Conversation{}, fmt.Errorf("create conversation: %w", err)
	}
	return c, nil
}

// GetConversation reads one conversation.
func (s *Store) GetConversation(ctx context.Context, id string) (wire.Conversation, error) {
	c, err := scanConversation(s.r.QueryRowContext(ctx, s.q(`SELECT `+conversationCols+conversationFrom+` WHERE c.id = ?`), id))
	if errors.Is(err, sql.ErrNoRows) {
		return c, store.ErrNotFound
	}
	if err != nil {
		return c, fmt.Errorf("get conversation: %w", err)
	}
	return c, nil
}

// ListConversations lists conversations, oldest first.
func (s *Store) ListConversations(ctx context.Context) ([]wire.Conversation, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+conversationCols+conversationFrom+` ORDER BY c.created_at, c.id`)
	if err != nil {
		return nil, fmt.Errorf("list conversations: %w", err)
	}
	defer rows.Close()
	out := []wire.Conversation{}
	for rows.Next() {
		c, err := scanConversation(rows)
		if err != nil {
			return nil, fmt.Errorf("list conversations: %w", err)
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// EnqueueTurn appends a turn to a usable or quarantined conversation (K13). The conversation
// row is updated first, which serializes enqueues and job endings of one
// conversation on PostgreSQL, so exactly one unfinished job is its head.
func (s *Store) EnqueueTurn(ctx context.Context, conversationID, prompt string, now time.Time) (wire.Job, error) {
	if strings.TrimSpace(prompt) == "" {
		return wire.Job{}, fmt.Errorf("enqueue turn: %w: prompt is required", store.ErrInvalid)
	}
	id := newID("job")
	err := s.write(ctx, func(tx txn) error {
		var seq int64
		err := tx.QueryRowContext(ctx, s.q(`UPDATE conversations SET next_seq = next_seq + 1, updated_at = ?
			WHERE id = ? AND state IN ('usable', 'quarantined') RETURNING next_seq`), ns(now), conversationID).Scan(&seq)
		if errors.Is(err, sql.ErrNoRows) {
			var state string
			err := tx.QueryRowContext(ctx, s.q(`SELECT state FROM conversations WHERE id = ?`), conversationID).Scan(&state)
			if errors.Is(err, sql.ErrNoRows) {
				return store.ErrNotFound
			}
			if err != nil {
				return err
			}
			if state == wire.ConversationDeleted {
				return store.ErrConversationDeleted
			}
			return store.ErrConversationLost
		}
		if err != nil {
			return err
		}
		if _, err := s.exec(ctx, tx, `INSERT INTO jobs (id, conversation_id, seq, prompt, state, head, sandbox_host_id, created_at, route)
			SELECT ?, ?, ?, ?, 'queued',
				CASE WHEN EXISTS (SELECT 1 FROM jobs WHERE conversation_id = ? AND state IN ('queued', 'running')) THEN 0 ELSE 1 END,
				sandbox_host_id, ?, requires FROM conversations WHERE id = ?`,
			id, conversationID, seq, prompt, conversationID, ns(now), conversationID); err != nil {
			return err
		}
		return s.event(ctx, tx, id, "", now, "queued", map[string]any{"seq": seq})
	})
	if err != nil {
		return wire.Job{}, fmt.Errorf("enqueue turn: %w", err)
	}
	return s.GetJob(ctx, id)
}

// GetJob returns the job with its attempts and events, all read from one
// snapshot: read statement by statement, a reader could see the reaper's
// superseded attempt beside the job row from before it, still running.
func (s *Store) GetJob(ctx context.Context, id string) (wire.Job, error) {
	opts := &sql.TxOptions{ReadOnly: true}
	if s.d == postgres {
		opts.Isolation = sql.LevelRepeatableRead // one snapshot for the whole transaction
	} // SQLite: a read transaction in WAL mode reads one snapshot
	tx, err := s.r.BeginTx(ctx, opts)
	if err != nil {
		return wire.Job{}, fmt.Errorf("get job: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // read only: nothing to keep
	j, err := s.getJob(ctx, tx, id)
	if err != nil {
		return j, err
	}
	j.Events, err = s.jobEvents(ctx, tx, id, 0, 0)
	if err != nil {
		return j, err
	}
	j.PendingPermissions = store.PendingPermissions(j, j.Events)
	return j, nil
}

type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func (s *Store) getJob(ctx context.Context, db querier, id string) (wire.Job, error) {
	var j wire.Job
	var cancel, created int64
	var ended, reclaimed sql.NullInt64
	var admitted sql.NullString
	var notBefore int64
	err := db.QueryRowContext(ctx, s.q(`SELECT id, conversation_id, seq, prompt, state, outcome, reason, cancel_requested,
		attempt_count, worker_lost_count, admitted_attempt_id, created_at, ended_at, detail_reclaimed_at,
		release_count, release_class, not_before, cause, cause_evidence FROM jobs WHERE id = ?`), id).Scan(
		&j.ID, &j.ConversationID, &j.Seq, &j.Prompt, &j.State, &j.Outcome, &j.Reason, &cancel,
		&j.AttemptCount, &j.WorkerLostCount, &admitted, &created, &ended, &reclaimed,
		&j.ReleaseCount, &j.ReleaseClass, &notBefore, &j.Cause, &j.CauseEvidence)
	if errors.Is(err, sql.ErrNoRows) {
		return j, store.ErrNotFound
	}
	if err != nil {
		return j, fmt.Errorf("get job: %w", err)
	}
	j.CancelRequested = cancel != 0
	j.Admitted = admitted.Valid
	j.CreatedAt = fromNS(created)
	j.EndedAt = nsPtr(ended)
	j.DetailReclaimedAt = nsPtr(reclaimed)
	if j.State == wire.JobQueued && notBefore > 0 {
		j.NotBefore = nsPtr(sql.NullInt64{Int64: notBefore, Valid: true})
	}
	if j.State == wire.JobQueued {
		if j.Unroutable, err = s.jobUnroutable(ctx, db, id); err != nil {
			return j, fmt.Errorf("get job: %w", err)
		}
	}

	rows, err := db.QueryContext(ctx, s.q(`SELECT id, generation, state, lease_owner, lease_expires_at, claimed_at,
		ended_at, outcome, container_id, COALESCE(activation_id, ''), counts_as_attempt
		FROM attempts WHERE job_id = ? ORDER BY generation`), id)
	if err != nil {
		return j, fmt.Errorf("get job attempts: %w", err)
	}
	defer rows.Close()
	j.Attempts = []wire.Attempt{}
	for rows.Next() {
		var a wire.Attempt
		var exp, claimed, counts int64
		var aEnded sql.NullInt64
		if err := rows.Scan(&a.ID, &a.Generation, &a.State, &a.LeaseOwner, &exp, &claimed, &aEnded,
			&a.Outcome, &a.ContainerID, &a.ActivationID, &counts); err != nil {
			return j, fmt.Errorf("get job attempts: %w", err)
		}
		a.LeaseExpiresAt, a.ClaimedAt, a.EndedAt = fromNS(exp), fromNS(claimed), nsPtr(aEnded)
		a.CountsAsAttempt = counts != 0
		j.Attempts = append(j.Attempts, a)
	}
	return j, rows.Err()
}

// JobEvents returns events numbered above after, in the order of their
// numbers, at most limit (0: all). ErrNotFound if the job does not exist.
func (s *Store) JobEvents(ctx context.Context, jobID string, after int64, limit int) ([]wire.JobEvent, error) {
	return s.jobEvents(ctx, s.r, jobID, after, limit)
}

func (s *Store) jobEvents(ctx context.Context, db querier, jobID string, after int64, limit int) ([]wire.JobEvent, error) {
	var n int
	if err := db.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM jobs WHERE id = ?`), jobID).Scan(&n); err != nil {
		return nil, fmt.Errorf("job events: %w", err)
	}
	if n == 0 {
		return nil, store.ErrNotFound
	}
	query := `SELECT n, job_id, attempt_id, time, source, type, data FROM job_events WHERE job_id = ? AND n > ? ORDER BY n`
	args := []any{jobID, after}
	if limit > 0 {
		query += ` LIMIT ?`
		args = append(args, limit)
	}
	rows, err := db.QueryContext(ctx, s.q(query), args...)
	if err != nil {
		return nil, fmt.Errorf("job events: %w", err)
	}
	defer rows.Close()
	out := []wire.JobEvent{}
	for rows.Next() {
		var e wire.JobEvent
		var t int64
		var data string
		if err := rows.Scan(&e.ID, &e.JobID, &e.AttemptID, &t, &e.Source, &e.Type, &data); err != nil {
			return nil, fmt.Errorf("job events: %w", err)
		}
		e.Time = fromNS(t)
		if data != "" {
			e.Data = json.RawMessage(data)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// CancelJob ends a queued job at once; for a running one it sets the flag
// that the next renewal answer carries (P7). ErrGone if the job has ended.
func (s *Store) CancelJob(ctx context.Context, id string, now time.Time) (wire.Job, error) {
	err := s.write(ctx, func(tx txn) error {
		var state, conv string
		var already int64
		err := tx.QueryRowContext(ctx, s.q(`SELECT state, conversation_id, cancel_requested FROM jobs WHERE id = ?`+s.lockRow()), id).Scan(&state, &conv, &already)
		if errors.Is(err, sql.ErrNoRows) {
			return store.ErrNotFound
		}
		if err != nil {
			return err
		}
		switch state {
		case wire.JobQueued:
			if _, err := s.exec(ctx, tx, `UPDATE jobs SET state = 'cancelled', outcome = 'cancelled', reason = ?,
				cancel_requested = 1, head = 0, ended_at = ? WHERE id = ?`, reasonCancelled, ns(now), id); err != nil {
				return err
			}
			if err := s.event(ctx, tx, id, "", now, "cancelled", nil); err != nil {
				return err
			}
			return s.advance(ctx, tx, conv, now)
		case wire.JobRunning:
			if already != 0 {
				return nil
			}
			if _, err := s.exec(ctx, tx, `UPDATE jobs SET cancel_requested = 1 WHERE id = ?`, id); err != nil {
				return err
			}
			return s.event(ctx, tx, id, "", now, "cancel_requested", nil)
		default:
			return store.ErrGone
		}
	})
	if err != nil {
		return wire.Job{}, fmt.Errorf("cancel job: %w", err)
	}
	return s.GetJob(ctx, id)
}

// lockRow is appended to a SELECT of one row the transaction will change.
func (s *Store) lockRow() string {
	if s.d == postgres {
		return " FOR UPDATE"
	}
	return ""
}

// event appends a control-plane event to a job.
func (s *Store) event(ctx context.Context, tx txn, jobID, attemptID string, now time.Time, typ string, data any) error {
	var body string
	if data != nil {
		b, err := json.Marshal(data)
		if err != nil {
			return err
		}
		body = string(b)
	}
	n, err := s.numberEvents(ctx, tx, jobID, 1)
	if err != nil {
		return err
	}
	_, err = s.exec(ctx, tx, `INSERT INTO job_events (job_id, n, attempt_id, time, source, type, data) VALUES (?, ?, ?, ?, 'control', ?, ?)`,
		jobID, n, attemptID, ns(now), typ, body)
	return err
}

// events appends one control-plane event to each job a query names: its
// columns are a job id and an attempt id (” for none).
func (s *Store) events(ctx context.Context, tx txn, query string, args []any, now time.Time, typ string, data any) error {
	rows, err := tx.QueryContext(ctx, s.q(query), args...)
	if err != nil {
		return err
	}
	var pairs [][2]string
	for rows.Next() {
		var p [2]string
		if err := rows.Scan(&p[0], &p[1]); err != nil {
			rows.Close()
			return err
		}
		pairs = append(pairs, p)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, p := range pairs {
		if err := s.event(ctx, tx, p[0], p[1], now, typ, data); err != nil {
			return err
		}
	}
	return nil
}

// numberEvents reserves k event numbers of a job and returns the first.
// Events are numbered per job under the lock of the job's counter row,
// held to commit, so a job's events commit in the order of their numbers
// and a follower paging by number never passes one that commits late.
func (s *Store) numberEvents(ctx context.Context, tx txn, jobID string, k int64) (int64, error) {
	var last int64
	err := tx.QueryRowContext(ctx, s.q(`INSERT INTO job_event_counts (job_id, last) VALUES (?, ?)
		ON CONFLICT (job_id) DO UPDATE SET last = job_event_counts.last + excluded.last RETURNING last`),
		jobID, k).Scan(&last)
	return last - k + 1, err
}

// advance makes the oldest unfinished job of a conversation its head, if
// none is running. Called by every transition that ends or requeues a job.
// Updating the conversation row first orders it against EnqueueTurn.
func (s *Store) advance(ctx context.Context, tx txn, conversationID string, now time.Time) error {
	if _, err := s.exec(ctx, tx, `UPDATE conversations SET updated_at = ? WHERE id = ?`, ns(now), conversationID); err != nil {
		return err
	}
	_, err := s.exec(ctx, tx, `UPDATE jobs SET head = 1 WHERE state = 'queued' AND pos = (
		SELECT MIN(pos) FROM jobs WHERE conversation_id = ? AND state IN ('queued', 'running'))`, conversationID)
	return err
}

// quarantine marks a conversation quarantined (K13): its admitted turn
// jobID ended without a recorded settlement. It keeps its queued turns and
// takes new ones; the next turn verifies and resumes it or reports it
// unrecoverable. A LOST conversation stays LOST (R31: never cleared).
func (s *Store) quarantine(ctx context.Context, tx txn, conversationID, jobID string, now time.Time) error {
	_, err := s.exec(ctx, tx, `UPDATE conversations SET state = 'quarantined', interrupted_job_id = ?, updated_at = ?
		WHERE id = ? AND state IN ('usable', 'quarantined')`, jobID, ns(now), conversationID)
	return err
}

// loseConversation marks a conversation LOST (R30, R35) with a plain reason
// (R32) and fails its queued turns: a LOST conversation never runs again.
// A quarantined one that failed verification is lost the same way (K13);
// a LOST one stays as it is.
func (s *Store) loseConversation(ctx context.Context, tx txn, conversationID, reason string, now time.Time) error {
	if _, err := s.exec(ctx, tx, `UPDATE conversations SET state = 'lost', lost_reason = ?, interrupted_job_id = '', updated_at = ?
		WHERE id = ? AND state IN ('usable', 'quarantined')`, reason, ns(now), conversationID); err != nil {
		return err
	}
	if err := s.events(ctx, tx, `SELECT id, '' FROM jobs WHERE conversation_id = ? AND state = 'queued'`,
		[]any{conversationID}, now, "failed", map[string]any{"cause": "conversation_lost"}); err != nil {
		return err
	}
	_, err := s.exec(ctx, tx, `UPDATE jobs SET state = 'failed', outcome = 'failed', reason = ?, head = 0, ended_at = ?
		WHERE conversation_id = ? AND state = 'queued'`, reasonQueuedLost, ns(now), conversationID)
	return err
}

// permissionEvents are a job's events of its ACP permission requests.
func (s *Store) permissionEvents(ctx context.Context, db querier, jobID string) ([]wire.JobEvent, error) {
	rows, err := db.QueryContext(ctx, s.q(`SELECT n, attempt_id, time, type, data FROM job_events
		WHERE job_id = ? AND type IN (?, ?, ?) ORDER BY n`), jobID,
		wire.EventPermissionRequested, wire.EventPermissionAnswered, wire.EventPermissionAnswer)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []wire.JobEvent
	for rows.Next() {
		e := wire.JobEvent{JobID: jobID}
		var t int64
		var data string
		if err := rows.Scan(&e.ID, &e.AttemptID, &t, &e.Type, &data); err != nil {
			return nil, err
		}
		e.Time = fromNS(t)
		e.Data = json.RawMessage(data)
		out = append(out, e)
	}
	return out, rows.Err()
}

// AnswerPermission checks, under the job's row lock (SQLite: its one
// writer), that the request is pending and offers the option, and records
// the answer as a control event of the request's attempt: a second answer
// finds it answered.
func (s *Store) AnswerPermission(ctx context.Context, jobID, requestID, optionID string, now time.Time) error {
	err := s.write(ctx, func(tx txn) error {
		var state string
		err := tx.QueryRowContext(ctx, s.q(`SELECT state FROM jobs WHERE id = ?`+s.lockRow()), jobID).Scan(&state)
		if errors.Is(err, sql.ErrNoRows) {
			return store.ErrNotFound
		}
		if err != nil {
			return err
		}
		j, err := s.getJob(ctx, tx, jobID)
		if err != nil {
			return err
		}
		evs, err := s.permissionEvents(ctx, tx, jobID)
		if err != nil {
			return err
		}
		for _, p := range store.PendingPermissions(j, evs) {
			if p.RequestID != requestID {
				continue
			}
			for _, o := range p.Options {
				if o.OptionID == optionID {
					return s.event(ctx, tx, jobID, p.AttemptID, now, wire.EventPermissionAnswer,
						map[string]string{"request_id": requestID, "option_id": optionID})
				}
			}
			return fmt.Errorf("%w: option_id %q is not one of the request's options.", store.ErrInvalid, optionID)
		}
		return store.ErrNotPending
	})
	if err != nil {
		return fmt.Errorf("answer permission: %w", err)
	}
	return nil
}

// PermissionAnswer reads the owner's recorded answer, if any.
func (s *Store) PermissionAnswer(ctx context.Context, jobID, attemptID, requestID string) (string, error) {
	evs, err := s.permissionEvents(ctx, s.r, jobID)
	if err != nil {
		return "", fmt.Errorf("permission answer: %w", err)
	}
	for _, e := range evs {
		var d struct {
			RequestID string `json:"request_id"`
			OptionID  string `json:"option_id"`
		}
		if e.Type == wire.EventPermissionAnswer && e.AttemptID == attemptID &&
			json.Unmarshal(e.Data, &d) == nil && d.RequestID == requestID {
			return d.OptionID, nil
		}
	}
	return "", nil
}

// encodeLimits is the limits column of l: empty for none, else its JSON.
func encodeLimits(l wire.Limits) (string, error) {
	if l.IsZero() {
		return "", nil
	}
	b, err := json.Marshal(l)
	return string(b), err
}

// decodeLimits reads a limits column (encodeLimits).
func decodeLimits(s string) (wire.Limits, error) {
	var l wire.Limits
	if s == "" {
		return l, nil
	}
	if err := json.Unmarshal([]byte(s), &l); err != nil {
		return l, fmt.Errorf("decode limits: %w", err)
	}
	return l, nil
}
