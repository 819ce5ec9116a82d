package sqlstore

import (
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// The worker's calls on PostgreSQL, each one round trip in its common
// case: one statement outside any transaction (a finish: two statements
// pipelined as one implicit transaction) whose WHERE is the worker token's
// hash, the job, the attempt, its generation and its live lease (K3),
// judged at the database's clock read inside it, and whose data-modifying
// parts apply what the call's transaction would. A statement that changes
// nothing leaves the call to the ordinary path (refusedAs, then the
// transaction), which words the refusal and records the stale report, or
// handles what the statement does not: a repeat, an interrupted
// settlement, a finish other than succeeded. SQLite takes the ordinary
// path at once: its writer costs no round trip.

// pgClock is the now of a worker statement: $1, or NULL for the
// database's clock (dbNow).
const pgClock = `clock AS (SELECT COALESCE(CAST($1 AS BIGINT), ` + dbNow + `) AS t)`

// pgWorkerGuard is workerGuard in PostgreSQL's placeholders: $2 attempt
// id, $3 generation, $4 token hash (hex), $5 job id, judged at clock.
var pgWorkerGuard = `attempts.id = $2 AND attempts.token_hash = $4 AND attempts.job_id = $5 AND ` + fenceOpen +
	`attempts.generation = $3 AND attempts.state = 'running' AND ` + leaseLiveAt(`(SELECT t FROM clock)`) + fenceClose

// pgEvent numbers (under the job's counter lock, numberEvents) and
// inserts one control event of the job of the CTE from, with the
// attempt $2 at clock. Its data is the SQL expression data.
func pgEvent(from, typ, data string) string {
	return `cnt AS (
	INSERT INTO job_event_counts (job_id, last) SELECT job_id, 1 FROM ` + from + `
	ON CONFLICT (job_id) DO UPDATE SET last = job_event_counts.last + excluded.last RETURNING job_id, last
), ev AS (
	INSERT INTO job_events (job_id, n, attempt_id, time, source, type, data)
	SELECT cnt.job_id, cnt.last, $2, (SELECT t FROM clock), 'control', '` + typ + `', ` + data + ` FROM cnt
)`
}

// nowArg is $1 of a worker statement: NULL for the database's clock,
// or the time given (a test clock's when one is set).
func (s *Store) nowArg(ctx context.Context, now time.Time) (any, error) {
	if now.IsZero() && s.cfg.clock == nil {
		return nil, nil
	}
	if now.IsZero() {
		var err error
		if now, err = s.Now(ctx); err != nil {
			return nil, err
		}
	}
	return ns(now), nil
}

func pgWorkerArgs(now any, w store.Worker, ref wire.AttemptRef, rest ...any) []any {
	return append([]any{now, ref.AttemptID, ref.LeaseGeneration, hex.EncodeToString(w.TokenHash), w.JobID}, rest...)
}

// workerRow runs a worker statement that answers one row, or none when it
// changed nothing (ok false).
func (s *Store) workerRow(ctx context.Context, query string, qargs []any, dest ...any) (ok bool, err error) {
	err = s.one(ctx, func(tx txn) error { return tx.QueryRowContext(ctx, query, qargs...).Scan(dest...) })
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// AppendEventsAs is AppendEvents for the worker w (see store.Store).
func (s *Store) AppendEventsAs(ctx context.Context, w store.Worker, ref wire.AttemptRef, events []wire.Event, now time.Time) (wire.EventsResponse, error) {
	if s.d == postgres {
		resp, ok, err := s.appendEventsPG(ctx, w, ref, events, now)
		if ok || err != nil {
			return resp, err
		}
	}
	now, err := s.refusedAs(ctx, w, ref, now)
	if err != nil {
		return wire.EventsResponse{}, fmt.Errorf("append events: %w", err)
	}
	return s.AppendEvents(ctx, ref, events, now)
}

// appendEventsPG stores events none of whose seqs the attempt has stored:
// numbered in order under the job's counter lock, as AppendEvents does. A
// repeat of a seq is left to AppendEvents (it takes no number).
func (s *Store) appendEventsPG(ctx context.Context, w store.Worker, ref wire.AttemptRef, events []wire.Event, now time.Time) (wire.EventsResponse, bool, error) {
	n := len(events)
	seqs, times, types, data := make([]int64, n), make([]int64, n), make([]string, n), make([]string, n)
	seen := make(map[int64]bool, n)
	for i, e := range events {
		if e.Seq <= 0 || e.Type == "" || (len(e.Data) > 0 && !json.Valid(e.Data)) {
			return wire.EventsResponse{}, false, fmt.Errorf("append events: %w: every event needs seq > 0, a type and JSON data", store.ErrInvalid)
		}
		if seen[e.Seq] {
			return wire.EventsResponse{}, false, nil // a repeat inside the request: AppendEvents
		}
		seen[e.Seq] = true
		seqs[i], types[i], data[i] = e.Seq, e.Type, string(e.Data)
		if !e.Time.IsZero() {
			times[i] = ns(e.Time)
		}
	}
	nowA, err := s.nowArg(ctx, now)
	if err != nil {
		return wire.EventsResponse{}, false, fmt.Errorf("append events: %w", err)
	}
	var resp wire.EventsResponse
	ok, err := s.workerRow(ctx, appendEventsPGStatement, pgWorkerArgs(nowA, w, ref, seqs, times, types, data, int64(n)), &resp.StoredThrough)
	if isConstraint(err, "job_events_runner_seq") {
		// The same seqs stored meanwhile by an upload that raced this one
		// (both saw none, and this one waited for the job's counter): a
		// repeat, which rolled back whole and is AppendEvents' to answer.
		return wire.EventsResponse{}, false, nil
	}
	if err != nil {
		return resp, false, fmt.Errorf("append events: %w", err)
	}
	return resp, ok, nil
}

// appendEventsPGStatement stores one upload's events: pgWorkerArgs, then
// $6 … $9 the events' seqs, times (0: the statement's clock), types and
// data, $10 how many. It answers the attempt's stored_through, or no row
// when it changed nothing.
var appendEventsPGStatement = `WITH ` + pgClock + `, a AS (
	UPDATE attempts SET lease_ttl = lease_ttl WHERE ` + pgWorkerGuard + `
		AND NOT EXISTS (SELECT 1 FROM job_events e WHERE e.attempt_id = attempts.id AND e.seq = ANY(CAST($6 AS BIGINT[])))
	RETURNING job_id
), cnt AS (
	INSERT INTO job_event_counts (job_id, last) SELECT job_id, CAST($10 AS BIGINT) FROM a
	ON CONFLICT (job_id) DO UPDATE SET last = job_event_counts.last + excluded.last RETURNING job_id, last
), ins AS (
	INSERT INTO job_events (job_id, n, attempt_id, seq, time, source, type, data)
	SELECT cnt.job_id, cnt.last - CAST($10 AS BIGINT) + e.k, $2, e.seq, COALESCE(NULLIF(e.t, 0), (SELECT t FROM clock)), 'runner', e.typ, e.data
	FROM cnt, unnest(CAST($6 AS BIGINT[]), CAST($7 AS BIGINT[]), CAST($8 AS TEXT[]), CAST($9 AS TEXT[])) WITH ORDINALITY AS e(seq, t, typ, data, k)
)
SELECT GREATEST(COALESCE((SELECT MAX(seq) FROM job_events WHERE attempt_id = $2 AND seq IS NOT NULL), 0),
	COALESCE((SELECT MAX(s) FROM unnest(CAST($6 AS BIGINT[])) AS s), 0)) FROM a`

// AdmitAs is Admit for the worker w (see store.Store).
func (s *Store) AdmitAs(ctx context.Context, w store.Worker, ref wire.AttemptRef, activationID string, now time.Time) (wire.AdmissionReceipt, error) {
	if s.d == postgres && activationID != "" {
		r, ok, err := s.admitPG(ctx, w, ref, activationID, now)
		if ok || err != nil {
			return r, err
		}
	}
	now, err := s.refusedAs(ctx, w, ref, now)
	if err != nil {
		return wire.AdmissionReceipt{}, fmt.Errorf("admit: %w", err)
	}
	return s.Admit(ctx, ref, activationID, now)
}

// admitPG records a first admission; a repeat is Admit's.
func (s *Store) admitPG(ctx context.Context, w store.Worker, ref wire.AttemptRef, activationID string, now time.Time) (wire.AdmissionReceipt, bool, error) {
	r := wire.AdmissionReceipt{ReceiptID: newID("adm"), ActivationID: activationID}
	data, err := json.Marshal(map[string]any{"activation_id": activationID, "receipt_id": r.ReceiptID})
	if err != nil {
		return r, false, err
	}
	nowA, err := s.nowArg(ctx, now)
	if err != nil {
		return r, false, fmt.Errorf("admit: %w", err)
	}
	q := `WITH ` + pgClock + `, a AS (
	UPDATE attempts SET admitted_at = (SELECT t FROM clock), activation_id = $6, receipt_id = $7
	WHERE ` + pgWorkerGuard + ` AND activation_id IS NULL
	RETURNING job_id, admitted_at
), jb AS (
	UPDATE jobs SET admitted_attempt_id = $2 FROM a WHERE jobs.id = a.job_id RETURNING jobs.id, jobs.conversation_id
), ` + pgEvent("a", "admitted", `CAST($8 AS TEXT)`) + `
SELECT a.job_id, jb.conversation_id, a.admitted_at FROM a JOIN jb ON jb.id = a.job_id`
	var at int64
	ok, err := s.workerRow(ctx, q, pgWorkerArgs(nowA, w, ref, activationID, r.ReceiptID, string(data)), &r.JobID, &r.ConversationID, &at)
	if err != nil || !ok {
		return wire.AdmissionReceipt{}, false, wrapErr("admit", err)
	}
	r.AdmittedAt = fromNS(at)
	return r, true, nil
}

// SettleAs is Settle for the worker w (see store.Store).
func (s *Store) SettleAs(ctx context.Context, w store.Worker, ref wire.AttemptRef, req wire.SettlementRequest, now time.Time) (wire.Boundary, error) {
	if s.d == postgres && !req.Supervisor.Interrupted && req.ActivationID != "" && req.Supervisor.ActivationID == req.ActivationID {
		b, ok, err := s.settlePG(ctx, w, ref, req, now)
		if ok || err != nil {
			return b, err
		}
	}
	now, err := s.refusedAs(ctx, w, ref, now)
	if err != nil {
		return wire.Boundary{}, fmt.Errorf("settle: %w", err)
	}
	return s.Settle(ctx, ref, req, now)
}

// settlePG records a first settlement that is not interrupted; a repeat
// and an interrupted boundary (K10) are Settle's.
func (s *Store) settlePG(ctx context.Context, w store.Worker, ref wire.AttemptRef, req wire.SettlementRequest, now time.Time) (wire.Boundary, bool, error) {
	b := wire.Boundary{SnapshotID: newID("snap"), NativeTurn: req.Supervisor.NativeTurn}
	// The settled event's data as Settle writes it, the epoch spliced in.
	const epochAt = `"workspace_epoch":0`
	data, err := json.Marshal(map[string]any{"workspace_epoch": 0, "snapshot_id": b.SnapshotID, "native_turn": b.NativeTurn,
		"supervisor_receipt_id": req.Supervisor.ReceiptID})
	if err != nil {
		return b, false, err
	}
	head, tail, ok := strings.Cut(string(data), epochAt)
	if !ok {
		return b, false, fmt.Errorf("settle: the event's data has no epoch: %s", data)
	}
	nowA, err := s.nowArg(ctx, now)
	if err != nil {
		return b, false, fmt.Errorf("settle: %w", err)
	}
	q := `WITH ` + pgClock + `, a AS (
	UPDATE attempts SET snapshot_id = $6, settled_at = (SELECT t FROM clock), settled_interrupted = 0, boundary_native_turn = $7,
		boundary_epoch = (SELECT c.epoch + 1 FROM jobs j JOIN conversations c ON c.id = j.conversation_id WHERE j.id = attempts.job_id)
	WHERE ` + pgWorkerGuard + ` AND admitted_at IS NOT NULL AND activation_id = $8 AND snapshot_id IS NULL
	RETURNING job_id, settled_at, boundary_epoch
), cv AS (
	UPDATE conversations SET epoch = conversations.epoch + 1, native_turn = $7, snapshot_id = $6, updated_at = (SELECT t FROM clock)
	FROM a JOIN jobs j ON j.id = a.job_id WHERE conversations.id = j.conversation_id RETURNING conversations.epoch
), ` + pgEvent("a", "settled", `CAST($9 AS TEXT) || CAST((SELECT epoch FROM cv) AS TEXT) || CAST($10 AS TEXT)`) + `
SELECT a.settled_at, cv.epoch FROM a, cv`
	var at int64
	ok, err = s.workerRow(ctx, q, pgWorkerArgs(nowA, w, ref, b.SnapshotID, b.NativeTurn, req.ActivationID, head+`"workspace_epoch":`, tail), &at, &b.WorkspaceEpoch)
	if err != nil || !ok {
		return wire.Boundary{}, false, wrapErr("settle", err)
	}
	b.SettledAt = fromNS(at)
	return b, true, nil
}

// FinishAs is Finish for the worker w (see store.Store); on PostgreSQL
// concurrent finishes share one pipelined pair (finishBatcher).
func (s *Store) FinishAs(ctx context.Context, w store.Worker, ref wire.AttemptRef, req wire.FinishRequest, now time.Time) (wire.FinishResponse, error) {
	if s.d == postgres && coalescable(req) {
		a := s.finishCoalesced(ctx, w, ref, req, now)
		if a.ok || a.err != nil {
			return a.resp, wrapErr("finish", a.err)
		}
	}
	if s.d == sqlite {
		if now.IsZero() {
			var err error
			if now, err = s.Now(ctx); err != nil {
				return wire.FinishResponse{}, fmt.Errorf("finish: %w", err)
			}
		}
		return s.finish(ctx, &w, ref, req, now)
	}
	now, err := s.refusedAs(ctx, w, ref, now)
	if err != nil {
		return wire.FinishResponse{}, fmt.Errorf("finish: %w", err)
	}
	return s.Finish(ctx, ref, req, now)
}

// pipeline sends the statements queued by fill to PostgreSQL at once and
// reads their answers: one round trip, one implicit transaction (an
// error in one rolls back all).
func (s *Store) pipeline(ctx context.Context, fill func(b *pgx.Batch)) (err error) {
	if obs := s.cfg.txObserver; obs != nil {
		defer func(start time.Time) { obs(time.Since(start), err) }(time.Now())
	}
	conn, err := s.w.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		var b pgx.Batch
		fill(&b)
		return dc.(*stdlib.Conn).Conn().SendBatch(ctx, &b).Close()
	})
}

// wrapErr prefixes a failure with its call; nil stays nil.
func wrapErr(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", op, err)
}
