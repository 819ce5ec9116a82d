package sqlstore

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// maxFinishBatch bounds the finishes of one coalesced pair of statements;
// finishLanes, the pairs that run at once, is the pool's size: up to 16
// finishes in flight each run at once, as before finishes coalesced (on
// the 2-core machine, fewer lanes made B2 20–40% slower: PostgreSQL
// already flushes concurrent commits together, and a finish waiting for
// a lane waits for a whole batch), and beyond that they share statements
// instead of waiting for a connection.
const maxFinishBatch, finishLanes = 256, 16

// PostgreSQL's finishes coalesce (s.fb), as its renewals do: every finish
// queued while finishLanes batches run goes into the next one, which
// records those that end their job and leave its conversation as it is —
// succeeded for a settled, uninterrupted turn; failed or cancelled for a
// turn never admitted — in two statements pipelined as one implicit
// transaction (coalescedFinish, then coalescedAdvance; oneFinish and
// oneAdvance for a batch of one). Each finish is fenced on its own row
// (its token's hash, job, attempt, generation and live lease, at its own
// now) and answered on its own; one the first statement does not return
// takes FinishAs's ordinary path, which words its refusal alone or
// handles what the statement does not: a repeat (P2), K10, a second turn
// of a conversation already in the batch.
type finishBatcher = coalescer[finishReq, finishAnswer]

func (s *Store) newFinishBatcher() *finishBatcher {
	return newCoalescer(finishLanes, maxFinishBatch, s.finishBatch)
}

// finishReq is one caller's finish.
type finishReq struct {
	w   store.Worker
	ref wire.AttemptRef
	req wire.FinishRequest
	now time.Time
}

type finishAnswer struct {
	resp wire.FinishResponse
	ok   bool // finished; false: the ordinary path decides
	err  error
}

// coalescable says whether a finish is one coalescedFinish may record:
// the outcomes that end the job without touching the conversation's
// state (the rest: P6, R30, R31, K13 are Finish's).
func coalescable(req wire.FinishRequest) bool {
	switch req.Outcome {
	case wire.OutcomeSucceeded, wire.OutcomeFailed, wire.OutcomeCancelled:
		// A cause (S5) is recorded by Finish's ordinary path: the
		// coalesced statements write none.
		return !req.Ambiguous && !req.Unrecoverable && req.Cause == ""
	}
	return false
}

// finishCoalesced queues one finish and returns its answer. The stored
// answer (P2) has the time on the Go side, so a finish that brings none
// reads the store's clock first: with the pipelined pair, two round
// trips, the first outside the batch's.
func (s *Store) finishCoalesced(ctx context.Context, w store.Worker, ref wire.AttemptRef, req wire.FinishRequest, now time.Time) finishAnswer {
	if now.IsZero() {
		var err error
		if now, err = s.Now(ctx); err != nil {
			return finishAnswer{err: err}
		}
	}
	a, err := s.fb.do(ctx, finishReq{w: w, ref: ref, req: req, now: now})
	if err != nil {
		return finishAnswer{err: err}
	}
	return a
}

// coalescedFinish is the first statement of a batch. $1 … $13 are the
// finishes' attempt ids, generations, token hashes (hex), job ids, nows,
// reports, stored answers up to and after the conversation's state,
// finished events' data, outcomes (the job's as well as the attempt's:
// coalescable lets only succeeded, failed and cancelled through), the
// jobs' states and reasons, and their index in the batch. lk locks the attempts in job id
// order, so that two batches (of one replica's lanes, or two replicas')
// never wait on each other in a cycle. One finish per conversation (the first in
// the batch): a second turn of a conversation already finished here is
// not returned, and the ordinary path, after this commits, sees the first.
var coalescedFinish = `WITH r AS (
	SELECT * FROM unnest(CAST($1 AS TEXT[]), CAST($2 AS BIGINT[]), CAST($3 AS TEXT[]), CAST($4 AS TEXT[]), CAST($5 AS BIGINT[]),
		CAST($6 AS TEXT[]), CAST($7 AS TEXT[]), CAST($8 AS TEXT[]), CAST($9 AS TEXT[]), CAST($10 AS TEXT[]),
		CAST($11 AS TEXT[]), CAST($12 AS TEXT[]), CAST($13 AS BIGINT[]))
		AS r(id, gen, hash, job, now, rep, head, tail, data, outcome, jstate, reason, k)
), lk AS (
	SELECT r.*, jobs.conversation_id AS conv FROM r JOIN attempts ON ` + finishGuard + `
	JOIN jobs ON jobs.id = attempts.job_id
	ORDER BY attempts.job_id FOR UPDATE OF attempts
), f AS (
	SELECT DISTINCT ON (conv) * FROM lk ORDER BY conv, k
), a AS (
	UPDATE attempts SET state = 'finished', outcome = r.outcome, ended_at = r.now, report = r.rep,
		response = r.head || CAST(to_json((SELECT c.state FROM conversations c WHERE c.id = r.conv)) AS TEXT) || r.tail
	FROM f AS r WHERE ` + finishGuard + `
	RETURNING r.k, r.job, r.id, r.conv, r.now, r.data, r.outcome, r.jstate, r.reason, attempts.response
), jb AS (
	UPDATE jobs SET state = a.jstate, outcome = a.outcome, reason = a.reason, head = 0, live_attempt_id = NULL, ended_at = a.now
	FROM a WHERE jobs.id = a.job
), cv AS (
	UPDATE conversations SET updated_at = a.now FROM a WHERE conversations.id = a.conv
), cnt AS (
	INSERT INTO job_event_counts (job_id, last) SELECT job, 1 FROM a ORDER BY job
	ON CONFLICT (job_id) DO UPDATE SET last = job_event_counts.last + excluded.last RETURNING job_id, last
), ev AS (
	INSERT INTO job_events (job_id, n, attempt_id, time, source, type, data)
	SELECT cnt.job_id, cnt.last, a.id, a.now, 'control', 'finished', a.data FROM cnt JOIN a ON a.job = cnt.job_id
)
SELECT k, response FROM a`

// finishGuard fences a finish's row r at its own now, with the condition
// on the attempt that puts it in coalescedFinish's cases.
var finishGuard = unnestGuard(`r.now`) + ` AND CASE WHEN r.outcome = '` + wire.OutcomeSucceeded + `'
	THEN attempts.settled_at IS NOT NULL AND attempts.settled_interrupted = 0 ELSE attempts.admitted_at IS NULL END`

// coalescedAdvance is advance for the conversations of the attempts the
// batch finished ($1 their ids, $2 their nows): each one's next turn made
// its head. A second statement, so that its snapshot sees a turn
// enqueued while the first waited for the conversation's row
// (Race_FinishAsVsEnqueue). Each attempt is looked up by its id from
// the batch's row (a LATERAL subquery with LIMIT 1, which the planner
// cannot flatten into a join): as a join, the statistics of a busy fleet,
// whose attempts are mostly running, made it scan all of attempts for
// state 'finished' and join the batch to that (TestQueryPlansUseIndexes).
const coalescedAdvance = `UPDATE jobs SET head = 1 FROM (
	SELECT (SELECT MIN(q.pos) FROM jobs q WHERE q.conversation_id = j.conversation_id AND q.state IN ('queued', 'running')) AS pos
	FROM unnest(CAST($1 AS TEXT[]), CAST($2 AS BIGINT[])) AS f(id, t)
	CROSS JOIN LATERAL (SELECT a.job_id FROM attempts a WHERE a.id = f.id AND a.state = 'finished' AND a.ended_at = f.t LIMIT 1) AS a
	JOIN jobs j ON j.id = a.job_id
) AS c WHERE jobs.pos = c.pos AND jobs.state = 'queued'`

// oneFinish and oneAdvance are coalescedFinish and coalescedAdvance for
// a batch of one, in pgWorkerArgs' placeholders ($6 … $12: report,
// stored answer's head and tail, event data, outcome, the job's state,
// reason): measured on PostgreSQL, the statements over arrays
// cost about twice these, so that a finish alone, as most are below a
// crowd, costs what it did before finishes coalesced.
var oneFinish = `WITH ` + pgClock + `, a AS (
	UPDATE attempts SET state = 'finished', outcome = $10, ended_at = (SELECT t FROM clock), report = $6,
		response = CAST($7 AS TEXT) || CAST(to_json((SELECT c.state FROM jobs j JOIN conversations c ON c.id = j.conversation_id
			WHERE j.id = attempts.job_id)) AS TEXT) || CAST($8 AS TEXT)
	WHERE ` + pgWorkerGuard + ` AND CASE WHEN $10 = '` + wire.OutcomeSucceeded + `'
		THEN settled_at IS NOT NULL AND settled_interrupted = 0 ELSE admitted_at IS NULL END
	RETURNING job_id, response
), jb AS (
	UPDATE jobs SET state = $11, outcome = $10, reason = $12, head = 0, live_attempt_id = NULL, ended_at = (SELECT t FROM clock)
	FROM a WHERE jobs.id = a.job_id RETURNING jobs.conversation_id
), cv AS (
	UPDATE conversations SET updated_at = (SELECT t FROM clock) FROM jb WHERE conversations.id = jb.conversation_id
), ` + pgEvent("a", "finished", `CAST($9 AS TEXT)`) + `
SELECT 0, response FROM a`

const oneAdvance = `UPDATE jobs SET head = 1 WHERE state = 'queued' AND pos = (SELECT MIN(pos) FROM jobs
	WHERE state IN ('queued', 'running') AND conversation_id = (SELECT j.conversation_id FROM attempts a JOIN jobs j ON j.id = a.job_id
		WHERE a.id = $1 AND a.state = 'finished' AND a.ended_at = $2))`

// finishBatch records one batch of finishes and returns each one's
// answer.
func (s *Store) finishBatch(batch []finishReq) []finishAnswer {
	n := len(batch)
	answers := make([]finishAnswer, n)
	var ids, hashes, jobs, reps, heads, tails, data, outcomes, jstates, reasons []string
	var gens, nows, ks []int64
	resps := make([]wire.FinishResponse, n)
	for i, r := range batch {
		head, tail, d, err := finishParts(r.req, r.now, &resps[i])
		if err != nil {
			answers[i].err = err
			continue
		}
		state, reason := finishEnd(r.req.Outcome)
		rep := report{Op: wire.OpFinish, Outcome: r.req.Outcome, Class: r.req.Class, Reason: r.req.Reason}.String()
		ids, gens, hashes, jobs = append(ids, r.ref.AttemptID), append(gens, r.ref.LeaseGeneration), append(hashes, hex.EncodeToString(r.w.TokenHash)), append(jobs, r.w.JobID)
		nows, reps, heads, tails, data = append(nows, ns(r.now)), append(reps, rep), append(heads, head), append(tails, tail), append(data, d)
		outcomes, jstates, reasons, ks = append(outcomes, r.req.Outcome), append(jstates, state), append(reasons, reason), append(ks, int64(i))
	}
	if len(ids) == 0 {
		return answers
	}
	stored := make([]string, n)
	var err error
	// Against another transaction locking the same rows in another
	// order, PostgreSQL may end one as a deadlock; the pair, rolled back
	// whole, simply runs again.
	for try := 0; try == 0 || (err != nil && s.retryable(err) && try < 8); try++ {
		clear(stored)
		err = s.pipeline(context.Background(), func(bt *pgx.Batch) {
			s.fb.statements.Add(1)
			q, qargs := coalescedFinish, []any{ids, gens, hashes, jobs, nows, reps, heads, tails, data, outcomes, jstates, reasons, ks}
			adv, advArgs := coalescedAdvance, []any{ids, nows}
			if len(ids) == 1 {
				q, qargs = oneFinish, []any{nows[0], ids[0], gens[0], hashes[0], jobs[0], reps[0], heads[0], tails[0], data[0], outcomes[0], jstates[0], reasons[0]}
				adv, advArgs = oneAdvance, []any{ids[0], nows[0]}
			}
			bt.Queue(q, qargs...).Query(func(rows pgx.Rows) error {
				for rows.Next() {
					var k int64
					var resp string
					if err := rows.Scan(&k, &resp); err != nil {
						return err
					}
					if len(ids) == 1 {
						k = ks[0]
					}
					if k < 0 || k >= int64(n) {
						return fmt.Errorf("finish %d of a batch of %d", k, n)
					}
					stored[k] = resp
				}
				return rows.Err()
			})
			bt.Queue(adv, advArgs...)
		})
	}
	for i := range batch {
		switch {
		case answers[i].err != nil:
		case err != nil:
			answers[i].err = err
		case stored[i] != "":
			resp := resps[i]
			if e := json.Unmarshal([]byte(stored[i]), &resp); e != nil {
				answers[i].err = e
				continue
			}
			answers[i] = finishAnswer{resp: resp, ok: true}
			s.fb.answered.Add(1)
		}
	}
	return answers
}

// finishEnd is what Finish decides for a coalescable finish: the job's
// end and its reason.
func finishEnd(outcome string) (state, reason string) {
	switch outcome {
	case wire.OutcomeFailed:
		return wire.JobFailed, reasonFailed
	case wire.OutcomeCancelled:
		return wire.JobCancelled, reasonCancelled
	}
	return wire.JobSucceeded, ""
}

// finishParts are a finish's stored answer as respond writes it, up to
// and after the conversation's state, which the statement splices in,
// and its finished event's data; resp is set to the answer without it.
func finishParts(req wire.FinishRequest, now time.Time, resp *wire.FinishResponse) (head, tail, data string, err error) {
	state, _ := finishEnd(req.Outcome)
	*resp = wire.FinishResponse{JobState: state, RecordedAt: fromNS(ns(now))}
	const stateAt = `"conversation_state":""`
	b, err := json.Marshal(*resp)
	if err != nil {
		return "", "", "", err
	}
	head, tail, ok := strings.Cut(string(b), stateAt)
	if !ok {
		return "", "", "", fmt.Errorf("the answer has no conversation state: %s", b)
	}
	d, err := json.Marshal(req)
	if err != nil {
		return "", "", "", err
	}
	return head + `"conversation_state":`, tail, string(d), nil
}
