package sqlstore

import (
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// report is the canonical form of a terminal report, stored on the attempt
// so that the same report again gets the first answer (P2).
type report struct {
	Op        string `json:"op"`
	Outcome   string `json:"outcome,omitempty"`
	Class     string `json:"class,omitempty"`
	Reason    string `json:"reason,omitempty"`
	Ambiguous bool   `json:"admission_ambiguous,omitempty"`
	Unrecover bool   `json:"context_unrecoverable,omitempty"`
}

func (r report) String() string {
	b, _ := json.Marshal(r)
	return string(b)
}

// repeated returns the stored answer if a is an attempt that already ended
// on exactly this report.
func repeated(a attemptRow, ref wire.AttemptRef, rep string) (wire.FinishResponse, bool) {
	var resp wire.FinishResponse
	if a.generation != ref.LeaseGeneration || a.state == wire.AttemptRunning || a.report != rep || a.response == "" {
		return resp, false
	}
	return resp, json.Unmarshal([]byte(a.response), &resp) == nil
}

// Finish records the terminal report (see store.Store).
func (s *Store) Finish(ctx context.Context, ref wire.AttemptRef, req wire.FinishRequest, now time.Time) (wire.FinishResponse, error) {
	return s.finish(ctx, nil, ref, req, now)
}

// finish is Finish, with the worker's token checked too when wk is not
// nil: in the guarded UPDATE itself, and when that changes nothing, in the
// same transaction before the refusal is worded (AuthorizeAttempt's
// answers first, then the attempt's) — SQLite's FinishAs, one write on the
// single writer and no read beside it.
func (s *Store) finish(ctx context.Context, wk *store.Worker, ref wire.AttemptRef, req wire.FinishRequest, now time.Time) (wire.FinishResponse, error) {
	switch req.Outcome {
	case wire.OutcomeSucceeded, wire.OutcomeFailed, wire.OutcomeCancelled, wire.OutcomeWorkerLost:
	default:
		return wire.FinishResponse{}, fmt.Errorf("finish: %w: unknown outcome", store.ErrInvalid)
	}
	if req.Cause != "" && !req.Cause.Valid() || len(req.CauseEvidence) > wire.MaxCauseEvidenceBytes {
		return wire.FinishResponse{}, fmt.Errorf("finish: %w: cause not on the closed list, or its evidence too long", store.ErrInvalid)
	}
	rep := report{Op: wire.OpFinish, Outcome: req.Outcome, Class: req.Class, Reason: req.Reason, Ambiguous: req.Ambiguous, Unrecover: req.Unrecoverable}.String()
	var resp wire.FinishResponse
	cond, condArgs := guard, guardArgs(ref, now)
	if wk != nil {
		cond, condArgs = guard+` AND token_hash = ? AND job_id = ?`, append(condArgs, hex.EncodeToString(wk.TokenHash), wk.JobID)
	}
	err := s.write(ctx, func(tx txn) error {
		var jobID string
		var admitted, settled sql.NullInt64
		var interrupted int64
		err := tx.QueryRowContext(ctx, s.q(`UPDATE attempts SET state = 'finished', outcome = ?, ended_at = ?, report = ?
			WHERE `+cond+` RETURNING job_id, admitted_at, settled_at, settled_interrupted`),
			args([]any{req.Outcome, ns(now), rep}, condArgs...)...).Scan(&jobID, &admitted, &settled, &interrupted)
		if errors.Is(err, sql.ErrNoRows) {
			if wk != nil {
				auth, err := s.authorize(ctx, tx, wk.JobID, wk.TokenHash)
				if err != nil {
					return err
				}
				if auth.AttemptID != ref.AttemptID {
					return store.ErrOtherAttempt
				}
			}
			a, err := s.loadAttempt(ctx, tx, ref.AttemptID, now)
			if err != nil {
				return err
			}
			if r, ok := repeated(a, ref, rep); ok {
				resp = r
				return nil
			}
			if a.live(ref) {
				return errRaced
			}
			return s.stale(ctx, tx, wire.OpFinish, ref, a, now)
		}
		if err != nil {
			return err
		}
		if req.Outcome == wire.OutcomeSucceeded && !settled.Valid {
			return fmt.Errorf("%w: succeeded needs a recorded settlement", store.ErrInvalid)
		}
		if req.Outcome == wire.OutcomeSucceeded && interrupted != 0 {
			return fmt.Errorf("%w: an interrupted turn did not succeed", store.ErrInvalid)
		}
		var conv string
		if err := tx.QueryRowContext(ctx, s.q(`SELECT conversation_id FROM jobs WHERE id = ?`), jobID).Scan(&conv); err != nil {
			return err
		}
		if err := s.event(ctx, tx, jobID, ref.AttemptID, now, "finished", req); err != nil {
			return err
		}
		switch {
		case req.Outcome == wire.OutcomeSucceeded:
			err = s.endJob(ctx, tx, jobID, conv, wire.JobSucceeded, wire.OutcomeSucceeded, "", now)
		case req.Outcome == wire.OutcomeWorkerLost && !admitted.Valid:
			// P6: the host died before admission; not an attempt.
			if _, err := s.exec(ctx, tx, `UPDATE attempts SET state = 'worker_lost', counts_as_attempt = 0 WHERE id = ?`, ref.AttemptID); err != nil {
				return err
			}
			_, err = s.requeueLost(ctx, tx, jobID, ref.AttemptID, s.cfg.maxWorkerLost, now)
		default:
			state, reason := wire.JobFailed, reasonFailed
			if req.Outcome == wire.OutcomeCancelled {
				state, reason = wire.JobCancelled, reasonCancelled
				if interrupted != 0 {
					// K10: interrupted at the supervisor and settled there;
					// the conversation continues from that boundary.
					reason = reasonInterruptedByUser
				}
			}
			if req.Outcome == wire.OutcomeWorkerLost && !settled.Valid {
				// P6: the host died after admission; the counts say so,
				// and it is not an attempt.
				if _, err := s.exec(ctx, tx, `UPDATE attempts SET state = 'worker_lost', counts_as_attempt = 0 WHERE id = ?`, ref.AttemptID); err != nil {
					return err
				}
				if _, err := s.exec(ctx, tx, `UPDATE jobs SET worker_lost_count = worker_lost_count + 1, attempt_count = attempt_count - 1
					WHERE id = ?`, jobID); err != nil {
					return err
				}
			}
			var convState string
			if err := tx.QueryRowContext(ctx, s.q(`SELECT state FROM conversations WHERE id = ?`), conv).Scan(&convState); err != nil {
				return err
			}
			switch {
			case req.Ambiguous && !admitted.Valid && !req.Unrecoverable:
				// R30: the runner never learned whether its admission
				// committed, and the attempt's own record says it did
				// not; ended now, the attempt can never be admitted. The
				// turn never started and the conversation stays as it
				// was: a missing answer is no evidence of a loss.
				if state == wire.JobFailed {
					reason = reasonNotStarted
				}
			case req.Unrecoverable && convState == wire.ConversationQuarantined:
				// K13: the retained sandbox failed the verification.
				err = s.loseConversation(ctx, tx, conv, reasonLostUnverified, now)
			case req.Unrecoverable:
				// R31: the retained session is gone; report it, never guess.
				err = s.loseConversation(ctx, tx, conv, reasonLostSession, now)
			case admitted.Valid && !settled.Valid:
				// K13: the prompt may have reached the agent; it is
				// never replayed, and the conversation is quarantined,
				// not lost: this attempt is fenced from now on, and the
				// next turn verifies the retained sandbox.
				if state == wire.JobFailed {
					reason = reasonInterrupted
				}
				err = s.quarantine(ctx, tx, conv, jobID, now)
			}
			if err != nil {
				return err
			}
			err = s.endJob(ctx, tx, jobID, conv, state, outcomeOf(state), reason, now)
		}
		if err != nil {
			return err
		}
		if err := s.setCause(ctx, tx, jobID, req.Cause, req.CauseEvidence); err != nil {
			return err
		}
		resp, err = s.respond(ctx, tx, jobID, conv, ref.AttemptID, now)
		return err
	})
	if err != nil {
		return wire.FinishResponse{}, fmt.Errorf("finish: %w", err)
	}
	return resp, nil
}

// setCause records why a job that ended failed or cancelled ended (S5); a
// job requeued or succeeded keeps none.
func (s *Store) setCause(ctx context.Context, tx txn, jobID string, cause wire.Cause, evidence string) error {
	if cause == "" {
		return nil
	}
	_, err := s.exec(ctx, tx, `UPDATE jobs SET cause = ?, cause_evidence = ? WHERE id = ? AND state IN ('failed', 'cancelled')`,
		string(cause), evidence, jobID)
	return err
}

func outcomeOf(jobState string) string {
	if jobState == wire.JobCancelled {
		return wire.OutcomeCancelled
	}
	return wire.OutcomeFailed
}

// respond builds the answer of a terminal report and stores it on the
// attempt for repeats (P2).
func (s *Store) respond(ctx context.Context, tx txn, jobID, conv, attemptID string, now time.Time) (wire.FinishResponse, error) {
	resp := wire.FinishResponse{RecordedAt: fromNS(ns(now))}
	if err := tx.QueryRowContext(ctx, s.q(`SELECT j.state, c.state FROM jobs j, conversations c WHERE j.id = ? AND c.id = ?`),
		jobID, conv).Scan(&resp.JobState, &resp.ConversationState); err != nil {
		return resp, err
	}
	b, err := json.Marshal(resp)
	if err != nil {
		return resp, err
	}
	_, err = s.exec(ctx, tx, `UPDATE attempts SET response = ? WHERE id = ?`, string(b), attemptID)
	return resp, err
}

// endJob moves a job to a terminal state and lets its conversation's next
// turn run.
func (s *Store) endJob(ctx context.Context, tx txn, jobID, conv, state, outcome, reason string, now time.Time) error {
	if _, err := s.exec(ctx, tx, `UPDATE jobs SET state = ?, outcome = ?, reason = ?, head = 0, live_attempt_id = NULL, ended_at = ?
		WHERE id = ?`, state, outcome, reason, ns(now), jobID); err != nil {
		return err
	}
	return s.advance(ctx, tx, conv, now)
}

// requeueLost puts a never-admitted job whose host was lost back in the
// queue without counting the attempt (P6), unless it was cancelled or has
// been lost more than maxLost times. The caller has already marked the
// attempt as not counted. It returns the job's new state.
func (s *Store) requeueLost(ctx context.Context, tx txn, jobID, attemptID string, maxLost int, now time.Time) (string, error) {
	var lost, cancel int64
	var conv, state string
	if err := tx.QueryRowContext(ctx, s.q(`UPDATE jobs SET worker_lost_count = worker_lost_count + 1,
		attempt_count = attempt_count - 1, live_attempt_id = NULL,
		state = CASE WHEN cancel_requested = 0 AND worker_lost_count < ? THEN 'queued' ELSE state END
		WHERE id = ? RETURNING worker_lost_count, cancel_requested, conversation_id, state`),
		maxLost, jobID).Scan(&lost, &cancel, &conv, &state); err != nil {
		return "", err
	}
	switch {
	case state == wire.JobQueued:
		return state, s.event(ctx, tx, jobID, attemptID, now, "requeued", map[string]any{"cause": "worker_lost", "worker_lost_count": lost})
	case cancel != 0:
		return wire.JobCancelled, s.endJob(ctx, tx, jobID, conv, wire.JobCancelled, wire.OutcomeCancelled, reasonCancelled, now)
	default:
		if err := s.event(ctx, tx, jobID, attemptID, now, "worker_lost_cap", map[string]any{"worker_lost_count": lost, "max": maxLost}); err != nil {
			return "", err
		}
		return wire.JobFailed, s.endJob(ctx, tx, jobID, conv, wire.JobFailed, wire.OutcomeFailed, fmt.Sprintf(reasonWorkerLostCap, lost), now)
	}
}

// Abandon ends a never-admitted attempt as failed; the conversation stays
// usable (R29). The guard itself requires admitted_at IS NULL (R30).
func (s *Store) Abandon(ctx context.Context, ref wire.AttemptRef, req wire.AbandonRequest, now time.Time) (wire.FinishResponse, error) {
	rep := report{Op: wire.OpAbandon, Class: req.Class, Reason: req.Reason}.String()
	var resp wire.FinishResponse
	err := s.write(ctx, func(tx txn) error {
		var jobID string
		err := tx.QueryRowContext(ctx, s.q(`UPDATE attempts SET state = 'abandoned', outcome = 'failed', ended_at = ?, report = ?
			WHERE `+guard+` AND admitted_at IS NULL RETURNING job_id`),
			args([]any{ns(now), rep}, guardArgs(ref, now)...)...).Scan(&jobID)
		if errors.Is(err, sql.ErrNoRows) {
			a, err := s.loadAttempt(ctx, tx, ref.AttemptID, now)
			if err != nil {
				return err
			}
			if r, ok := repeated(a, ref, rep); ok {
				resp = r
				return nil
			}
			if a.live(ref) && !a.admitted {
				return errRaced
			}
			if a.live(ref) {
				return store.ErrAdmitted
			}
			return s.stale(ctx, tx, wire.OpAbandon, ref, a, now)
		}
		if err != nil {
			return err
		}
		var conv string
		if err := tx.QueryRowContext(ctx, s.q(`SELECT conversation_id FROM jobs WHERE id = ?`), jobID).Scan(&conv); err != nil {
			return err
		}
		if err := s.event(ctx, tx, jobID, ref.AttemptID, now, "abandoned", map[string]any{"class": req.Class, "reason": req.Reason}); err != nil {
			return err
		}
		if err := s.endJob(ctx, tx, jobID, conv, wire.JobFailed, wire.OutcomeFailed, reasonNotStarted, now); err != nil {
			return err
		}
		resp, err = s.respond(ctx, tx, jobID, conv, ref.AttemptID, now)
		return err
	})
	if err != nil {
		return wire.FinishResponse{}, fmt.Errorf("abandon: %w", err)
	}
	return resp, nil
}

// releaseGuard is R36 in the statement itself: the live attempt, and no
// admission of the job, neither on the attempt nor on the job.
const releaseGuard = guard + ` AND admitted_at IS NULL
	AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = attempts.job_id AND j.admitted_attempt_id IS NOT NULL)`

// Release requeues a turn whose child provably never accepted it (R33,
// R36). The same release again is a no-op.
func (s *Store) Release(ctx context.Context, ref wire.AttemptRef, req wire.ReleaseRequest, now time.Time) error {
	rep := report{Op: wire.OpRelease, Class: req.Class}.String()
	err := s.write(ctx, func(tx txn) error {
		var jobID string
		err := tx.QueryRowContext(ctx, s.q(`UPDATE attempts SET state = 'released', ended_at = ?, counts_as_attempt = 0, report = ?
			WHERE `+releaseGuard+` RETURNING job_id`),
			args([]any{ns(now), rep}, guardArgs(ref, now)...)...).Scan(&jobID)
		if errors.Is(err, sql.ErrNoRows) {
			a, err := s.loadAttempt(ctx, tx, ref.AttemptID, now)
			if err != nil {
				return err
			}
			if a.state == wire.AttemptReleased && a.generation == ref.LeaseGeneration && a.report == rep {
				return nil // the same release again
			}
			if a.live(ref) {
				return store.ErrAdmitted
			}
			return s.stale(ctx, tx, wire.OpRelease, ref, a, now)
		}
		if err != nil {
			return err
		}
		// K7: counted, then either waited out or, past the cap, the end.
		var conv string
		var cancel, n int64
		if err := tx.QueryRowContext(ctx, s.q(`UPDATE jobs SET attempt_count = attempt_count - 1, live_attempt_id = NULL,
			release_count = release_count + 1, release_class = ?, state = 'queued'
			WHERE id = ? RETURNING conversation_id, cancel_requested, release_count`), req.Class, jobID).Scan(&conv, &cancel, &n); err != nil {
			return err
		}
		retry := now.Add(store.ReleaseBackoff(s.cfg.releaseWait, n))
		data := map[string]any{"class": req.Class, "release_count": n}
		if cancel == 0 && n <= int64(s.cfg.maxReleases) {
			data["not_before"] = fromNS(ns(retry))
		}
		if err := s.event(ctx, tx, jobID, ref.AttemptID, now, "released", data); err != nil {
			return err
		}
		switch {
		case cancel != 0:
			return s.endJob(ctx, tx, jobID, conv, wire.JobCancelled, wire.OutcomeCancelled, reasonCancelled, now)
		case n > int64(s.cfg.maxReleases):
			if err := s.event(ctx, tx, jobID, ref.AttemptID, now, "release_cap", map[string]any{
				"release_count": n, "max": s.cfg.maxReleases, "class": req.Class,
			}); err != nil {
				return err
			}
			return s.endJob(ctx, tx, jobID, conv, wire.JobFailed, wire.OutcomeFailed, fmt.Sprintf(reasonReleaseCap, n, req.Class), now)
		}
		_, err = s.exec(ctx, tx, `UPDATE jobs SET not_before = ? WHERE id = ?`, ns(retry), jobID)
		return err
	})
	if err != nil {
		return fmt.Errorf("release: %w", err)
	}
	return nil
}
