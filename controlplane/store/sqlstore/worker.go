package sqlstore

import (
	"context"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// guard is the fencing condition of every attempt-scoped write (P1): the
// attempt, its generation, running, and a live lease (leaseLive, K3); its
// arguments come from guardArgs. fenceOpen and fenceClose are empty but in
// the chaos campaign's deliberately broken build (fence_broken.go).
const guard = `id = ? AND ` + fenceOpen + `generation = ? AND state = 'running' AND ` + leaseLive + fenceClose

func guardArgs(ref wire.AttemptRef, now time.Time) []any {
	return []any{ref.AttemptID, ref.LeaseGeneration, ns(now), ns(now)}
}

func args(first []any, rest ...any) []any { return append(first, rest...) }

// Claim takes the oldest runnable job the host may run: ClaimMany of one turn.
func (s *Store) Claim(ctx context.Context, p store.ClaimParams) (wire.Claim, bool, error) {
	p.More = nil
	cs, err := s.ClaimMany(ctx, p)
	if err != nil || len(cs) == 0 {
		return wire.Claim{}, false, err
	}
	return cs[0], true, nil
}

// ClaimMany takes the oldest runnable jobs the host may run, up to one per
// slot. The claim indexes hold only queued heads of their conversations,
// so this is the first entries of two partial indexes, each in the order
// of its ORDER BY (TestQueryPlansUseIndexes). With an idempotency key it
// first looks for the host's live attempts of that key (every slot's,
// slotKey) and answers them again (Replayed), the whole batch; a key
// whose attempts still run with their leases over is taken
// (store.ErrKeyTaken) until the reaper supersedes them. On PostgreSQL an
// unkeyed claim, or a keyed one with no running attempt of its key, is
// one statement (claimPG); the transaction below is SQLite's way, and
// PostgreSQL's for a replay, a taken key and a paused or unknown host.
func (s *Store) ClaimMany(ctx context.Context, p store.ClaimParams) ([]wire.Claim, error) {
	if len(p.WorkerTokenHash) == 0 || (len(p.KeyHash) > 0 && len(p.KeyHash) < 8) || len(p.More) >= maxBatchClaims {
		return nil, fmt.Errorf("claim: %w: a worker token hash is required, a key hash of at least 8 bytes, and at most %d turns", store.ErrInvalid, maxBatchClaims)
	}
	slots := append([]store.ClaimSlot{{AttemptID: p.AttemptID, WorkerTokenHash: p.WorkerTokenHash}}, p.More...)
	for i := range slots {
		if len(slots[i].WorkerTokenHash) == 0 {
			return nil, fmt.Errorf("claim: %w: every turn needs a worker token hash", store.ErrInvalid)
		}
		if slots[i].AttemptID == "" {
			slots[i].AttemptID = newID("att")
		}
	}
	ttl := p.LeaseTTL
	if ttl <= 0 {
		ttl = s.cfg.leaseTTL
	}
	var key any // NULL without a key
	if len(p.KeyHash) > 0 {
		key = hex.EncodeToString(p.KeyHash)
	}
	if s.d == postgres {
		cs, done, err := s.claimPG(ctx, p, slots, ttl, key)
		if done || err != nil {
			if err != nil {
				return nil, fmt.Errorf("claim: %w", err)
			}
			return cs, nil
		}
	}
	var cs []wire.Claim
	claim := func(tx txn) error {
		cs = cs[:0]
		if key != nil {
			if s.d == postgres {
				// Claims with one key take turns, so that a retry racing
				// its first request, still in flight, finds its attempt
				// rather than passing the rows it holds (SQLite's one
				// writer does this by itself).
				if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`,
					int64(binary.BigEndian.Uint64(p.KeyHash[:8]))); err != nil {
					return err
				}
			}
			var err error
			if cs, err = s.replayClaims(ctx, tx, p.HostID, key.(string), p.Now); err != nil || len(cs) > 0 {
				return err // a replay is the turns given before, not new ones: no pause stops it
			}
			// None of the key's attempts holds its lease; one still
			// running (the reaper's to supersede) keeps the key, and a
			// new attempt under it would break attempts_claim_key.
			var taken int
			err = tx.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM attempts
				WHERE host_id = ? AND claim_key >= ? AND claim_key < ? AND state = 'running'`),
				p.HostID, key, key.(string)+"/").Scan(&taken)
			if err != nil {
				return err
			}
			if taken > 0 {
				return store.ErrKeyTaken
			}
		}
		if open, err := s.hostClaims(ctx, tx, p.HostID); err != nil || !open {
			return err
		}
		for i, slot := range slots {
			c, found, err := s.claimOne(ctx, tx, p, slot, ttl, slotKey(key, i))
			if err != nil || !found {
				return err
			}
			cs = append(cs, c)
		}
		return nil
	}
	// attempts_claim_key holds one running attempt per host and slot key.
	if err := s.write(ctx, claim); err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	return cs, nil
}

// maxBatchClaims bounds the turns of one claim (wire.MaxClaimsPerRequest
// is less), so that slot keys keep two digits.
const maxBatchClaims = 100

// slotKey is the claim key of the i-th turn of a keyed claim: the key's
// hash for the first, as a claim of one turn always had, and the hash, a
// dot and two digits for the others, so that one key's attempts are the
// range [key, key+"/") of the attempts_claim_key index, in slot order
// (claimPGStatement spells the same). NULL (nil) without a key.
func slotKey(key any, i int) any {
	if key == nil || i == 0 {
		return key
	}
	return fmt.Sprintf("%s.%02d", key, i)
}

// claimOne takes one turn for slot inside a claim's transaction.
func (s *Store) claimOne(ctx context.Context, tx txn, p store.ClaimParams, slot store.ClaimSlot, ttl time.Duration, key any) (wire.Claim, bool, error) {
	c := wire.Claim{AttemptID: slot.AttemptID, LeaseTTLMS: ttl.Milliseconds(), HeldMS: p.Held.Milliseconds()}
	qa := []any{c.AttemptID, p.HostID, ns(p.Now), ns(p.Now), p.HostID}
	if p.PinnedOnly {
		qa = qa[:3] // the host's own range only (S2)
	}
	err := tx.QueryRowContext(ctx, s.q(s.claimStatement(p.PinnedOnly)), qa...).Scan(
		&c.JobID, &c.Turn.ConversationID, &c.Turn.Seq, &c.Turn.Prompt, &c.LeaseGeneration)
	if errors.Is(err, sql.ErrNoRows) {
		return c, false, nil
	}
	if err != nil {
		return c, false, err
	}
	exp := p.Now.Add(ttl)
	c.LeaseExpiresAt = fromNS(ns(exp))
	var owner string
	err = tx.QueryRowContext(ctx, s.q(`INSERT INTO attempts (id, job_id, generation, state, host_id, lease_owner,
		lease_ttl, lease_expires_at, claimed_at, token_hash, claim_key, claim_held)
		SELECT ?, ?, ?, 'running', id, name, ?, ?, ?, ?, ?, ? FROM hosts WHERE id = ? RETURNING lease_owner`),
		c.AttemptID, c.JobID, c.LeaseGeneration, int64(ttl), ns(exp), ns(p.Now),
		hex.EncodeToString(slot.WorkerTokenHash), key, int64(p.Held), p.HostID).Scan(&owner)
	if errors.Is(err, sql.ErrNoRows) {
		return c, false, store.ErrNotFound // no such host; the job stays queued
	}
	if err != nil {
		return c, false, err
	}
	if err := s.claimTurn(ctx, tx, &c, p.Now); err != nil {
		return c, false, err
	}
	return c, true, s.event(ctx, tx, c.JobID, c.AttemptID, p.Now, "claimed", map[string]any{
		"lease_owner": owner, "lease_generation": c.LeaseGeneration, "lease_expires_at": c.LeaseExpiresAt,
	})
}

// claimPG is ClaimMany on PostgreSQL in one statement, outside any
// transaction: the host's row (open: neither paused nor removed, locked
// FOR SHARE against a pause committing meanwhile), the jobs taken, their
// attempts, their claimed events numbered under each job's counter lock,
// and what the answers need of their conversations. done is false when
// the transaction must decide instead: no row for the host (paused or
// unknown: the transaction words it) or a running attempt of the key (a
// replay, or a key taken by an attempt whose lease is over). A keyed
// claim first takes its key's lock, pipelined before the statement: its
// retry, racing it, waits and then replays it.
func (s *Store) claimPG(ctx context.Context, p store.ClaimParams, slots []store.ClaimSlot, ttl time.Duration, key any) ([]wire.Claim, bool, error) {
	exp := fromNS(ns(p.Now.Add(ttl)))
	expJSON, err := json.Marshal(exp)
	if err != nil {
		return nil, false, err
	}
	// The claimed event's data as json.Marshal writes the map Claim's
	// transaction passes (keys in order), the generation and the owner's
	// name spliced in by the statement.
	prefix := `{"lease_expires_at":` + string(expJSON) + `,"lease_generation":`
	ids := make([]string, len(slots))
	hashes := make([]string, len(slots))
	for i, sl := range slots {
		ids[i], hashes[i] = sl.AttemptID, hex.EncodeToString(sl.WorkerTokenHash)
	}
	qargs := []any{p.HostID, ns(p.Now), len(slots), ids, hashes, int64(ttl), ns(exp), key, int64(p.Held), prefix}
	stmt := claimPGStatement
	if p.PinnedOnly {
		stmt = claimPGPinnedStatement
	}
	if key == nil {
		rows, err := s.w.QueryContext(ctx, stmt, qargs...)
		if err != nil {
			return nil, false, err
		}
		defer rows.Close()
		return claimedRows(rows, p, ttl, exp)
	}
	var cs []wire.Claim
	var done bool
	// Claims with one key take turns (as the transaction's do, on the same
	// lock), so that a retry racing its first request, still in flight,
	// waits for it and then, in a statement whose snapshot is taken after
	// the lock, finds its attempt (a replay) rather than the turns it
	// took, or none.
	err = s.pipeline(ctx, func(b *pgx.Batch) {
		b.Queue(`SELECT pg_advisory_xact_lock($1)`, int64(binary.BigEndian.Uint64(p.KeyHash[:8])))
		b.Queue(stmt, qargs...).Query(func(rows pgx.Rows) (err error) {
			cs, done, err = claimedRows(rows, p, ttl, exp)
			return err
		})
	})
	return cs, done, err
}

// claimedRows reads claimPGStatement's rows (see claimPG).
func claimedRows(rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}, p store.ClaimParams, ttl time.Duration, exp time.Time) ([]wire.Claim, bool, error) {
	var cs []wire.Claim
	host := false
	for rows.Next() {
		host = true
		var keyed bool
		var jobID, attemptID, conv, prompt, image, cmd, container, state, interrupted, protocol, policy, limits sql.NullString
		var seq, gen, epoch, native, queued sql.NullInt64
		if err := rows.Scan(&keyed, &jobID, &attemptID, &conv, &seq, &prompt, &gen, &image, &cmd, &container, &epoch, &native, &state, &interrupted, &protocol, &policy, &limits, &queued); err != nil {
			return nil, false, err
		}
		if keyed {
			return nil, false, nil // a replay or a taken key: the transaction's
		}
		if !jobID.Valid {
			continue // the host's row with no job
		}
		c := wire.Claim{JobID: jobID.String, AttemptID: attemptID.String, LeaseGeneration: gen.Int64, LeaseExpiresAt: exp,
			LeaseTTLMS: ttl.Milliseconds(), HeldMS: p.Held.Milliseconds(), QueuedMS: waitedMS(queued.Int64),
			Turn: wire.Turn{ConversationID: conv.String, Seq: seq.Int64, Prompt: prompt.String, Image: image.String,
				ContainerID: container.String, Epoch: epoch.Int64, NativeTurn: native.Int64,
				AgentProtocol: protocol.String, PermissionPolicy: policy.String,
				// K13: verify the activation the interrupted turn was admitted under, then resume
				Quarantined: state.String == wire.ConversationQuarantined, InterruptedActivationID: interrupted.String}}
		if err := json.Unmarshal([]byte(cmd.String), &c.Turn.AgentCommand); err != nil {
			return nil, false, err
		}
		var err error
		if c.Turn.Limits, err = decodeLimits(limits.String); err != nil {
			return nil, false, err
		}
		cs = append(cs, c)
	}
	if err := rows.Err(); err != nil {
		return nil, false, err
	}
	return cs, host, nil
}

// claimPGStatement is claimStatement for up to $3 turns, with the rest of
// the claim's transaction in the same statement. Arguments: $1 host id,
// $2 now, $3 how many turns, $4 and $5 the slots' attempt ids and worker
// token hashes (hex) in order, $6 the lease TTL, $7 the lease's expiry,
// $8 the key hash (hex) or NULL (each slot's claim key is slotKey's), $9 the hold, $10 the claimed event's
// data up to its generation. Each walk reads at most $3 rows of its index
// range, locked SKIP LOCKED (those not taken stay locked until the
// statement ends); the oldest $3 of them are taken, numbered in queue
// order to pair with the slots. One row per turn taken, or one row of
// NULLs when none is: no row means the host is paused or unknown.
const claimPGStatement = claimPGHead + claimPGAny + claimPGTail

// claimPGPinnedStatement is claimPGStatement for a host under pressure
// (store.ClaimParams.PinnedOnly): the walk of the host's own range only,
// no conversation's first turn (S2). The same arguments.
const claimPGPinnedStatement = claimPGHead + claimPGTail

// claimPGAny is claimPGStatement's walk of the turns any host may take.
const claimPGAny = `
		UNION ALL
		SELECT w.pos FROM routes r CROSS JOIN LATERAL (SELECT pos FROM jobs WHERE state = 'queued' AND head = 1
			AND sandbox_host_id IS NULL AND route >= r.labels AND route <= r.labels AND not_before <= $2
			ORDER BY route, pos LIMIT $3 FOR UPDATE SKIP LOCKED) AS w
		WHERE NOT EXISTS (SELECT 1 FROM route_labels rl WHERE rl.route = r.labels AND NOT EXISTS (
			SELECT 1 FROM host_labels hl WHERE hl.host_id = $1 AND hl.key = rl.key AND hl.value = rl.value))`

const claimPGHead = `WITH h AS (
	SELECT id, name FROM hosts WHERE id = $1 AND paused_at IS NULL AND removed_at IS NULL FOR SHARE
), keyed AS (
	SELECT 1 FROM attempts WHERE host_id = $1 AND claim_key >= CAST($8 AS TEXT) AND claim_key < CAST($8 AS TEXT) || '/'
		AND state = 'running'
), pick AS (
	SELECT pos, row_number() OVER (ORDER BY pos) AS k FROM (
		SELECT pos FROM (SELECT pos FROM jobs WHERE state = 'queued' AND head = 1 AND sandbox_host_id = $1
			AND not_before <= $2 ORDER BY pos LIMIT $3 FOR UPDATE SKIP LOCKED) AS pinned`

const claimPGTail = `
	) AS c ORDER BY pos LIMIT $3
), j AS (
	UPDATE jobs SET state = 'running', generation = jobs.generation + 1,
		attempt_count = jobs.attempt_count + 1, live_attempt_id = sl.a
	FROM pick JOIN unnest(CAST($4 AS TEXT[]), CAST($5 AS TEXT[])) WITH ORDINALITY AS sl(a, t, k) ON sl.k = pick.k
	WHERE jobs.pos = pick.pos AND jobs.state = 'queued' AND EXISTS (SELECT 1 FROM h) AND NOT EXISTS (SELECT 1 FROM keyed)
	RETURNING jobs.pos, jobs.id, jobs.conversation_id, jobs.seq, jobs.prompt, jobs.generation, jobs.created_at, sl.a, sl.t, sl.k
), att AS (
	INSERT INTO attempts (id, job_id, generation, state, host_id, lease_owner,
		lease_ttl, lease_expires_at, claimed_at, token_hash, claim_key, claim_held)
	SELECT j.a, j.id, j.generation, 'running', h.id, h.name, $6, $7, $2, j.t,
		CASE WHEN j.k = 1 THEN $8 ELSE CAST($8 AS TEXT) || '.' || lpad(CAST(j.k - 1 AS TEXT), 2, '0') END, $9 FROM j, h
), cnt AS (
	INSERT INTO job_event_counts (job_id, last) SELECT id, 1 FROM j
	ON CONFLICT (job_id) DO UPDATE SET last = job_event_counts.last + excluded.last RETURNING job_id, last
), ev AS (
	INSERT INTO job_events (job_id, n, attempt_id, time, source, type, data)
	SELECT j.id, cnt.last, j.a, $2, 'control', 'claimed',
		CAST($10 AS TEXT) || CAST(j.generation AS TEXT) || ',"lease_owner":' || CAST(to_json(h.name) AS TEXT) || '}'
	FROM j JOIN cnt ON cnt.job_id = j.id, h
)
SELECT EXISTS (SELECT 1 FROM keyed), j.id, j.a, j.conversation_id, j.seq, j.prompt, j.generation,
	c.image, c.agent_command, c.container_id, c.epoch, c.native_turn, c.state,
	(SELECT ia.activation_id FROM jobs ij JOIN attempts ia ON ia.id = ij.admitted_attempt_id
		WHERE ij.id = c.interrupted_job_id AND c.state = 'quarantined'),
	c.agent_protocol, c.permission_policy, c.limits, $2 - j.created_at
FROM h LEFT JOIN (j JOIN conversations c ON c.id = j.conversation_id) ON true
ORDER BY j.pos`

// replayClaims finds the host's running attempts claimed with key (every
// slot key of it), their leases not expired at now, and rebuilds their
// claim answers in slot order (the worker tokens are the caller's to
// derive again).
func (s *Store) replayClaims(ctx context.Context, tx txn, hostID, key string, now time.Time) ([]wire.Claim, error) {
	rows, err := tx.QueryContext(ctx, s.q(`SELECT a.id, a.job_id, a.generation, a.lease_expires_at, a.lease_ttl, a.claim_held,
		a.claimed_at, j.conversation_id, j.seq, j.prompt
		FROM attempts a JOIN jobs j ON j.id = a.job_id
		WHERE a.host_id = ? AND a.claim_key >= ? AND a.claim_key < ? AND a.state = 'running' AND a.lease_expires_at > ?
		ORDER BY a.claim_key`), hostID, key, key+"/", ns(now))
	if err != nil {
		return nil, err
	}
	var cs []wire.Claim
	var claimedAt []time.Time // each claim's time, for its queue wait
	for rows.Next() {
		var c wire.Claim
		var exp, ttl, held, claimed int64
		if err := rows.Scan(&c.AttemptID, &c.JobID, &c.LeaseGeneration, &exp, &ttl, &held, &claimed,
			&c.Turn.ConversationID, &c.Turn.Seq, &c.Turn.Prompt); err != nil {
			rows.Close()
			return nil, err
		}
		c.LeaseExpiresAt = fromNS(exp)
		c.LeaseTTLMS = time.Duration(ttl).Milliseconds()
		c.HeldMS = time.Duration(held).Milliseconds()
		c.Replayed = true
		cs = append(cs, c)
		claimedAt = append(claimedAt, fromNS(claimed))
	}
	rows.Close() // before the statements below, on SQLite's one connection
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for i := range cs {
		c := &cs[i]
		if err := s.claimTurn(ctx, tx, c, claimedAt[i]); err != nil {
			return nil, err
		}
		if err := s.event(ctx, tx, c.JobID, c.AttemptID, now, "claim_replayed", map[string]any{"lease_generation": c.LeaseGeneration}); err != nil {
			return nil, err
		}
	}
	return cs, nil
}

// claimTurn fills in the turn's conversation: its sandbox and boundary,
// and for a quarantined one the activation its interrupted turn was
// admitted under, which the supervisor must retain a record of (K13);
// and the turn's queue wait up to claimed, the claim's time.
func (s *Store) claimTurn(ctx context.Context, tx txn, c *wire.Claim, claimed time.Time) error {
	var cmd, state, interrupted, limits string
	var created int64
	if err := tx.QueryRowContext(ctx, s.q(`SELECT c.image, c.agent_command, c.container_id, c.epoch, c.native_turn, c.state,
		c.interrupted_job_id, c.agent_protocol, c.permission_policy, c.limits, j.created_at
		FROM conversations c JOIN jobs j ON j.conversation_id = c.id WHERE j.id = ?`), c.JobID).Scan(
		&c.Turn.Image, &cmd, &c.Turn.ContainerID, &c.Turn.Epoch, &c.Turn.NativeTurn, &state, &interrupted,
		&c.Turn.AgentProtocol, &c.Turn.PermissionPolicy, &limits, &created); err != nil {
		return err
	}
	c.QueuedMS = waitedMS(ns(claimed) - created)
	var err error
	if c.Turn.Limits, err = decodeLimits(limits); err != nil {
		return err
	}
	c.Turn.Quarantined = state == wire.ConversationQuarantined // K13: verify, then resume
	if c.Turn.Quarantined {
		err := tx.QueryRowContext(ctx, s.q(`SELECT COALESCE(a.activation_id, '')
			FROM jobs j JOIN attempts a ON a.id = j.admitted_attempt_id WHERE j.id = ?`), interrupted).Scan(&c.Turn.InterruptedActivationID)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
	}
	return json.Unmarshal([]byte(cmd), &c.Turn.AgentCommand)
}

// claimStatement takes the next job for a host: the oldest queued head of
// its conversation, past its release backoff (K7), among those whose
// sandbox lives on this host or that have none yet and whose route (the
// conversation's required labels) the host meets. Each branch is an
// ordered walk of a partial index, so turns the host may not take are
// never read: jobs_claim_host for the host's range; jobs_claim_any, keyed
// (route, pos), once per route the host meets, as a correlated subquery
// that reads the first row of that route's range. Routes are the distinct
// requirement sets, few and bounded however long the queue is; a host
// that meets none of the queued turns' routes reads the routes, its own
// labels and no job (TestQueryPlansUseIndexes). A route is met when none
// of its route_labels is missing from the host's host_labels, which the
// host's heartbeats keep; the route ” has no labels, so every host meets
// it. A turn pinned to this host's sandbox is not checked again: it can
// run nowhere else. The walk passes a job in its release backoff, so it
// never stands in front of other conversations' turns (a filter on the
// rows the walk meets: released jobs are few, and capped).
// MIN picks the oldest of the rows found. On PostgreSQL each walk locks
// its row with SKIP LOCKED; those not taken stay locked until commit, so a
// concurrent claimer passes them for a moment. The query-plan test
// explains this very text. Arguments: the new attempt id, the host id,
// now, now, the host id. pinnedOnly (a host under pressure, S2) leaves the
// walk of the turns any host may take out — no conversation's first turn —
// and with it the last two arguments.
func (s *Store) claimStatement(pinnedOnly bool) string {
	walk := func(cond, order string) string {
		return `SELECT pos FROM jobs WHERE state = 'queued' AND head = 1 AND ` + cond +
			` AND not_before <= ? ORDER BY ` + order + ` LIMIT 1` + s.lockSkip()
	}
	// The route walk's one value is written as a range and its order as
	// the index's key (route, pos). With "route = r.labels" PostgreSQL
	// takes route for a constant, and then walking the primary key with a
	// filter costs about the same as walking jobs_claim_any whenever one
	// route holds most of the queue; it chose the primary key, which reads
	// every queued turn of other routes ahead of this one's. A range is no
	// constant, so only jobs_claim_any gives the order without a sort.
	anyHost := `
			UNION ALL
			SELECT (` + walk(`sandbox_host_id IS NULL AND route >= r.labels AND route <= r.labels`, `route, pos`) + `) FROM routes r
			WHERE NOT EXISTS (SELECT 1 FROM route_labels rl WHERE rl.route = r.labels AND NOT EXISTS (
				SELECT 1 FROM host_labels hl WHERE hl.host_id = ? AND hl.key = rl.key AND hl.value = rl.value))`
	if pinnedOnly {
		anyHost = ""
	}
	return `UPDATE jobs SET state = 'running', generation = generation + 1,
		attempt_count = attempt_count + 1, live_attempt_id = ?
		WHERE pos = (SELECT MIN(pos) FROM (
			SELECT pos FROM (` + walk(`sandbox_host_id = ?`, `pos`) + `) AS pinned` + anyHost + `
		) AS c)
		AND state = 'queued'
		RETURNING id, conversation_id, seq, prompt, generation`
}

// AuthorizeAttempt maps a worker token hash to its attempt.
func (s *Store) AuthorizeAttempt(ctx context.Context, jobID string, tokenHash []byte) (store.AttemptAuth, error) {
	return s.authorize(ctx, s.r, jobID, tokenHash)
}

// authorize is AuthorizeAttempt on q: the read pool, or a write's
// transaction.
func (s *Store) authorize(ctx context.Context, q txn, jobID string, tokenHash []byte) (store.AttemptAuth, error) {
	var a store.AttemptAuth
	err := q.QueryRowContext(ctx, s.q(`SELECT job_id, id, host_id FROM attempts WHERE token_hash = ?`),
		hex.EncodeToString(tokenHash)).Scan(&a.JobID, &a.AttemptID, &a.HostID)
	if errors.Is(err, sql.ErrNoRows) {
		return store.AttemptAuth{}, store.ErrUnauthorized
	}
	if err != nil {
		return store.AttemptAuth{}, fmt.Errorf("authorize attempt: %w", err)
	}
	if a.JobID == jobID {
		return a, nil
	}
	var n int
	if err := q.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM jobs WHERE id = ?`), jobID).Scan(&n); err != nil {
		return store.AttemptAuth{}, fmt.Errorf("authorize attempt: %w", err)
	}
	if n == 0 {
		return store.AttemptAuth{}, store.ErrNotFound
	}
	return store.AttemptAuth{}, store.ErrForbidden
}

// attemptRow is an attempt as a refused write sees it.
type attemptRow struct {
	jobID      string
	generation int64
	state      string
	leaseLive  bool // leaseLive at the time it was read
	admitted   bool
	activation string
	settled    bool
	report     string
	response   string
}

func (a attemptRow) live(ref wire.AttemptRef) bool {
	return a.generation == ref.LeaseGeneration && a.state == wire.AttemptRunning && a.leaseLive
}

// loadAttempt reads an attempt as a refused write sees it at now.
func (s *Store) loadAttempt(ctx context.Context, tx txn, id string, now time.Time) (attemptRow, error) {
	var a attemptRow
	var admitted, settled sql.NullInt64
	var live int64
	err := tx.QueryRowContext(ctx, s.q(`SELECT job_id, generation, state, CASE WHEN `+leaseLive+` THEN 1 ELSE 0 END, admitted_at,
		COALESCE(activation_id, ''), settled_at, report, response FROM attempts WHERE id = ?`), ns(now), ns(now), id).Scan(
		&a.jobID, &a.generation, &a.state, &live, &admitted, &a.activation, &settled, &a.report, &a.response)
	a.leaseLive = live != 0
	if errors.Is(err, sql.ErrNoRows) {
		return a, store.ErrNotFound
	}
	a.admitted, a.settled = admitted.Valid, settled.Valid
	return a, err
}

// stale records a refused attempt-scoped write as a lease.stale_report
// event and returns ErrLeaseLost, keeping the transaction (P1).
func (s *Store) stale(ctx context.Context, tx txn, op string, ref wire.AttemptRef, a attemptRow, now time.Time) error {
	why := "lease_expired"
	switch {
	case a.generation != ref.LeaseGeneration:
		why = "generation_mismatch"
	case a.state != wire.AttemptRunning:
		why = "attempt_" + a.state
	}
	return s.staleReport(ctx, tx, op, ref, a.jobID, why, now)
}

// staleReport records the refusal why of a call to op as a
// lease.stale_report event and returns ErrLeaseLost, keeping the
// transaction (P1).
func (s *Store) staleReport(ctx context.Context, tx txn, op string, ref wire.AttemptRef, jobID, why string, now time.Time) error {
	if err := s.event(ctx, tx, jobID, ref.AttemptID, now, "lease.stale_report", map[string]any{
		"op": op, "lease_generation": ref.LeaseGeneration, "why": why,
	}); err != nil {
		return err
	}
	return keep{store.ErrLeaseLost}
}

// refused explains a guarded write that changed nothing: ErrNotFound for an
// unknown attempt, the live attempt's row (for the caller's own verdict),
// or ErrLeaseLost with a stale report.
func (s *Store) refused(ctx context.Context, tx txn, op string, ref wire.AttemptRef, now time.Time) (attemptRow, error) {
	a, err := s.loadAttempt(ctx, tx, ref.AttemptID, now)
	if err != nil {
		return a, err
	}
	if a.live(ref) {
		return a, nil
	}
	return a, s.stale(ctx, tx, op, ref, a, now)
}

// AppendEvents stores runner events, idempotent by (attempt, seq).
func (s *Store) AppendEvents(ctx context.Context, ref wire.AttemptRef, events []wire.Event, now time.Time) (wire.EventsResponse, error) {
	for _, e := range events {
		if e.Seq <= 0 || e.Type == "" || (len(e.Data) > 0 && !json.Valid(e.Data)) {
			return wire.EventsResponse{}, fmt.Errorf("append events: %w: every event needs seq > 0, a type and JSON data", store.ErrInvalid)
		}
	}
	var resp wire.EventsResponse
	err := s.write(ctx, func(tx txn) error {
		var jobID string
		err := tx.QueryRowContext(ctx, s.q(`UPDATE attempts SET lease_ttl = lease_ttl WHERE `+guard+` RETURNING job_id`),
			guardArgs(ref, now)...).Scan(&jobID)
		if errors.Is(err, sql.ErrNoRows) {
			_, err := s.refused(ctx, tx, wire.OpEvents, ref, now)
			if err == nil {
				err = errRaced
			}
			return err
		}
		if err != nil {
			return err
		}
		// The job's row lock numbers the events (numberEvents); a repeat
		// by (attempt, seq) is not stored again and takes no number.
		n, err := s.numberEvents(ctx, tx, jobID, 0)
		if err != nil {
			return err
		}
		for _, e := range events {
			t := e.Time
			if t.IsZero() {
				t = now
			}
			added, err := s.exec(ctx, tx, `INSERT INTO job_events (job_id, n, attempt_id, seq, time, source, type, data)
				VALUES (?, ?, ?, ?, ?, 'runner', ?, ?) ON CONFLICT DO NOTHING`,
				jobID, n, ref.AttemptID, e.Seq, ns(t), e.Type, string(e.Data))
			if err != nil {
				return err
			}
			n += added
		}
		if _, err := s.exec(ctx, tx, `UPDATE job_event_counts SET last = ? WHERE job_id = ?`, n-1, jobID); err != nil {
			return err
		}
		return tx.QueryRowContext(ctx, s.q(`SELECT COALESCE(MAX(seq), 0) FROM job_events WHERE attempt_id = ? AND seq IS NOT NULL`),
			ref.AttemptID).Scan(&resp.StoredThrough)
	})
	if err != nil {
		return wire.EventsResponse{}, fmt.Errorf("append events: %w", err)
	}
	return resp, nil
}

// RecordContainer records the retained sandbox's identity on the attempt
// and the conversation, and pins the conversation's turns to the
// attempt's host, where the sandbox now lives.
func (s *Store) RecordContainer(ctx context.Context, ref wire.AttemptRef, req wire.ContainerRequest, now time.Time) error {
	if req.ContainerID == "" || (req.Backend != "process" && req.Backend != "docker") {
		return fmt.Errorf("record container: %w: backend process|docker and container_id are required", store.ErrInvalid)
	}
	err := s.write(ctx, func(tx txn) error {
		var jobID, hostID string
		err := tx.QueryRowContext(ctx, s.q(`UPDATE attempts SET container_backend = ?, container_id = ? WHERE `+guard+` RETURNING job_id, host_id`),
			args([]any{req.Backend, req.ContainerID}, guardArgs(ref, now)...)...).Scan(&jobID, &hostID)
		if errors.Is(err, sql.ErrNoRows) {
			_, err := s.refused(ctx, tx, wire.OpContainer, ref, now)
			if err == nil {
				err = errRaced
			}
			return err
		}
		if err != nil {
			return err
		}
		// One statement unless the conversation is quarantined or a
		// resume is being repeated (K13).
		var conv string
		err = sql.ErrNoRows
		if req.Resumed == nil {
			err = tx.QueryRowContext(ctx, s.q(`UPDATE conversations SET container_backend = ?, container_id = ?, sandbox_host_id = ?, sandbox_state = 'running', updated_at = ?
				WHERE id = (SELECT conversation_id FROM jobs WHERE id = ?) AND state <> 'quarantined' RETURNING id`),
				req.Backend, req.ContainerID, hostID, ns(now), jobID).Scan(&conv)
		}
		if errors.Is(err, sql.ErrNoRows) {
			if conv, err = s.resume(ctx, tx, jobID, ref.AttemptID, req, now); err != nil {
				return err
			}
			_, err = s.exec(ctx, tx, `UPDATE conversations SET container_backend = ?, container_id = ?, sandbox_host_id = ?, sandbox_state = 'running', updated_at = ?
				WHERE id = ?`, req.Backend, req.ContainerID, hostID, ns(now), conv)
		}
		if err != nil {
			return err
		}
		// The sandbox lives on this host now: so do the conversation's
		// unfinished turns, a requeue of this one included.
		if _, err := s.exec(ctx, tx, `UPDATE jobs SET sandbox_host_id = ? WHERE conversation_id = ? AND state IN ('queued', 'running')`,
			hostID, conv); err != nil {
			return err
		}
		return s.event(ctx, tx, jobID, ref.AttemptID, now, "container_recorded",
			map[string]any{"backend": req.Backend, "container_id": req.ContainerID})
	})
	if err != nil {
		return fmt.Errorf("record container: %w", err)
	}
	return nil
}

// resume ends a conversation's quarantine (K13) on the turn's verified
// boundary: the exact container the conversation recorded, and a native
// turn of the recorded boundary (the interrupted turn never reached the
// agent) or one more (it did). It records that boundary; the workspace
// epoch and snapshot stay those of the last settlement. A usable
// conversation needs nothing, and the same resume again (an answer lost)
// is a no-op; anything else is ErrInvalid, and the conversation stays
// quarantined for the runner's unrecoverable report.
// It returns the conversation's id.
func (s *Store) resume(ctx context.Context, tx txn, jobID, attemptID string, req wire.ContainerRequest, now time.Time) (string, error) {
	var conv, state, backend, container, interrupted string
	var native int64
	if err := tx.QueryRowContext(ctx, s.q(`SELECT id, state, container_backend, container_id, native_turn, interrupted_job_id
		FROM conversations WHERE id = (SELECT conversation_id FROM jobs WHERE id = ?)`+s.lockRow()), jobID).Scan(
		&conv, &state, &backend, &container, &native, &interrupted); err != nil {
		return "", err
	}
	r := req.Resumed
	switch {
	case state != wire.ConversationQuarantined:
		if r != nil && (r.NativeTurn != native || req.ContainerID != container) {
			return "", fmt.Errorf("%w: the conversation is not quarantined", store.ErrInvalid)
		}
		return conv, nil // nothing to resume, or the same resume again
	case r == nil:
		return "", fmt.Errorf("%w: a quarantined conversation needs a verified boundary", store.ErrInvalid)
	case req.Backend != backend || req.ContainerID != container:
		return "", fmt.Errorf("%w: not the retained container", store.ErrInvalid)
	case r.NativeTurn != native && r.NativeTurn != native+1:
		return "", fmt.Errorf("%w: the native turn boundary changed", store.ErrInvalid)
	}
	if _, err := s.exec(ctx, tx, `UPDATE conversations SET state = 'usable', native_turn = ?, interrupted_job_id = '', updated_at = ?
		WHERE id = ?`, r.NativeTurn, ns(now), conv); err != nil {
		return "", err
	}
	return conv, s.event(ctx, tx, jobID, attemptID, now, "conversation_resumed", map[string]any{
		"interrupted_job_id": interrupted, "recorded_native_turn": native, "native_turn": r.NativeTurn,
	})
}

// Admit records the admission of the job into its conversation. The same
// attempt and activation again gets the same receipt; another activation
// of an admitted attempt gets ErrAdmitted.
func (s *Store) Admit(ctx context.Context, ref wire.AttemptRef, activationID string, now time.Time) (wire.AdmissionReceipt, error) {
	if activationID == "" {
		return wire.AdmissionReceipt{}, fmt.Errorf("admit: %w: activation_id is required", store.ErrInvalid)
	}
	newReceipt := newID("adm")
	var r wire.AdmissionReceipt
	err := s.write(ctx, func(tx txn) error {
		var at int64
		err := tx.QueryRowContext(ctx, s.q(`UPDATE attempts SET admitted_at = COALESCE(admitted_at, ?),
			activation_id = COALESCE(activation_id, ?), receipt_id = COALESCE(receipt_id, ?)
			WHERE `+guard+` AND (activation_id IS NULL OR activation_id = ?)
			RETURNING job_id, receipt_id, admitted_at`),
			args(args([]any{ns(now), activationID, newReceipt}, guardArgs(ref, now)...), activationID)...).Scan(&r.JobID, &r.ReceiptID, &at)
		if errors.Is(err, sql.ErrNoRows) {
			a, err := s.refused(ctx, tx, wire.OpAdmission, ref, now)
			if err != nil {
				return err
			}
			if a.activation == "" || a.activation == activationID {
				return errRaced
			}
			return store.ErrAdmitted // live, admitted under another activation
		}
		if err != nil {
			return err
		}
		r.ActivationID, r.AdmittedAt = activationID, fromNS(at)
		if err := tx.QueryRowContext(ctx, s.q(`SELECT conversation_id FROM jobs WHERE id = ?`), r.JobID).Scan(&r.ConversationID); err != nil {
			return err
		}
		if r.ReceiptID != newReceipt {
			return nil // a repeat: same receipt, nothing new
		}
		if _, err := s.exec(ctx, tx, `UPDATE jobs SET admitted_attempt_id = ? WHERE id = ?`, ref.AttemptID, r.JobID); err != nil {
			return err
		}
		return s.event(ctx, tx, r.JobID, ref.AttemptID, now, "admitted", map[string]any{"activation_id": activationID, "receipt_id": r.ReceiptID})
	})
	if err != nil {
		return wire.AdmissionReceipt{}, fmt.Errorf("admit: %w", err)
	}
	return r, nil
}

// CancelsRequested returns those of ids that are running attempts of the
// host whose job's cancel was requested (see store.Store). One read over
// the host's running attempts (index attempts_host).
func (s *Store) CancelsRequested(ctx context.Context, hostID string, ids []string) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	q := `SELECT a.id FROM attempts a JOIN jobs j ON j.id = a.job_id
		WHERE a.host_id = ? AND a.state = 'running' AND j.cancel_requested = 1 AND a.id IN (?` + strings.Repeat(", ?", len(ids)-1) + `)
		ORDER BY a.id`
	qargs := make([]any, 0, len(ids)+1)
	qargs = append(qargs, hostID)
	for _, id := range ids {
		qargs = append(qargs, id)
	}
	rows, err := s.r.QueryContext(ctx, s.q(q), qargs...)
	if err != nil {
		return nil, fmt.Errorf("cancels requested: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("cancels requested: %w", err)
		}
		out = append(out, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("cancels requested: %w", err)
	}
	return out, nil
}

// Settle records the settlement boundary once (R27).
func (s *Store) Settle(ctx context.Context, ref wire.AttemptRef, req wire.SettlementRequest, now time.Time) (wire.Boundary, error) {
	if req.ActivationID == "" || req.Supervisor.ActivationID != req.ActivationID {
		return wire.Boundary{}, fmt.Errorf("settle: %w: the supervisor receipt must be for the same activation", store.ErrInvalid)
	}
	newSnap := newID("snap")
	interrupted := 0
	if req.Supervisor.Interrupted {
		interrupted = 1
	}
	var b wire.Boundary
	err := s.write(ctx, func(tx txn) error {
		if interrupted == 1 {
			// K10: only the user's cancel interrupts a turn at the
			// supervisor; the flag is never cleared, so this cannot race.
			var cancel int64
			err := tx.QueryRowContext(ctx, s.q(`SELECT j.cancel_requested FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE a.id = ?`),
				ref.AttemptID).Scan(&cancel)
			if err == nil && cancel == 0 {
				return fmt.Errorf("%w: an interrupted boundary settles only a turn whose cancel was requested", store.ErrInvalid)
			}
			if err != nil && !errors.Is(err, sql.ErrNoRows) {
				return err
			}
		}
		var jobID string
		var settled int64
		// Every SET reads the row as it was: a repeat keeps the first
		// settlement's interrupted flag with its boundary.
		err := tx.QueryRowContext(ctx, s.q(`UPDATE attempts SET snapshot_id = COALESCE(snapshot_id, ?), settled_at = COALESCE(settled_at, ?),
			settled_interrupted = CASE WHEN snapshot_id IS NULL THEN ? ELSE settled_interrupted END
			WHERE `+guard+` AND admitted_at IS NOT NULL AND activation_id = ?
			RETURNING job_id, snapshot_id, settled_at, boundary_epoch, boundary_native_turn`),
			args(args([]any{newSnap, ns(now), interrupted}, guardArgs(ref, now)...), req.ActivationID)...).Scan(
			&jobID, &b.SnapshotID, &settled, &b.WorkspaceEpoch, &b.NativeTurn)
		if errors.Is(err, sql.ErrNoRows) {
			a, err := s.refused(ctx, tx, wire.OpSettlement, ref, now)
			if err != nil {
				return err
			}
			if !a.admitted {
				return store.ErrNotAdmitted
			}
			if a.activation == req.ActivationID {
				return errRaced
			}
			return s.stale(ctx, tx, wire.OpSettlement, ref, a, now) // another activation
		}
		if err != nil {
			return err
		}
		b.SettledAt = fromNS(settled)
		if b.SnapshotID != newSnap {
			return nil // a repeat: the recorded boundary, nothing bumped
		}
		b.NativeTurn = req.Supervisor.NativeTurn
		if err := tx.QueryRowContext(ctx, s.q(`UPDATE conversations SET epoch = epoch + 1, native_turn = ?, snapshot_id = ?, updated_at = ?
			WHERE id = (SELECT conversation_id FROM jobs WHERE id = ?) RETURNING epoch`),
			b.NativeTurn, b.SnapshotID, ns(now), jobID).Scan(&b.WorkspaceEpoch); err != nil {
			return err
		}
		if _, err := s.exec(ctx, tx, `UPDATE attempts SET boundary_epoch = ?, boundary_native_turn = ? WHERE id = ?`,
			b.WorkspaceEpoch, b.NativeTurn, ref.AttemptID); err != nil {
			return err
		}
		data := map[string]any{
			"workspace_epoch": b.WorkspaceEpoch, "snapshot_id": b.SnapshotID, "native_turn": b.NativeTurn,
			"supervisor_receipt_id": req.Supervisor.ReceiptID,
		}
		if interrupted == 1 {
			data["interrupted"] = true
		}
		return s.event(ctx, tx, jobID, ref.AttemptID, now, "settled", data)
	})
	if err != nil {
		return wire.Boundary{}, fmt.Errorf("settle: %w", err)
	}
	return b, nil
}

// Notice records the shared_workspace_settled notice once (R23).
func (s *Store) Notice(ctx context.Context, ref wire.AttemptRef, req wire.NoticeRequest, now time.Time) error {
	if req.Kind != wire.NoticeSharedWorkspaceSettled {
		return fmt.Errorf("notice: %w: unknown kind", store.ErrInvalid)
	}
	err := s.write(ctx, func(tx txn) error {
		var jobID string
		err := tx.QueryRowContext(ctx, s.q(`UPDATE attempts SET noticed_at = COALESCE(noticed_at, ?)
			WHERE `+guard+` AND settled_at IS NOT NULL RETURNING job_id`),
			args([]any{ns(now)}, guardArgs(ref, now)...)...).Scan(&jobID)
		if errors.Is(err, sql.ErrNoRows) {
			a, err := s.refused(ctx, tx, wire.OpNotices, ref, now)
			if err != nil {
				return err
			}
			if a.settled {
				return errRaced
			}
			return store.ErrNotAdmitted // live but not settled
		}
		if err != nil {
			return err
		}
		// Once per attempt; the guarded UPDATE above orders repeats.
		var seen int
		if err := tx.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM job_events WHERE job_id = ? AND attempt_id = ? AND type = ?`),
			jobID, ref.AttemptID, wire.NoticeSharedWorkspaceSettled).Scan(&seen); err != nil || seen > 0 {
			return err
		}
		return s.event(ctx, tx, jobID, ref.AttemptID, now, wire.NoticeSharedWorkspaceSettled,
			map[string]any{"workspace_epoch": req.Boundary.WorkspaceEpoch, "snapshot_id": req.Boundary.SnapshotID})
	})
	if err != nil {
		return fmt.Errorf("notice: %w", err)
	}
	return nil
}

// waitedMS is a queue wait of d nanoseconds as a claim says it, in
// milliseconds (a clock step backwards counts as none).
func waitedMS(d int64) *int64 {
	ms := time.Duration(max(d, 0)).Milliseconds()
	return &ms
}
