package sqlstore

import (
	"context"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
)

// seedSeries is a CTE of the integers 1..? that both dialects understand.
const seedSeries = `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) `

// SeedLeases writes the rows that len(tokenHashes) claims by the host
// hostID (named hostName) would leave: as many conversations, each with
// one turn whose attempt runs under a lease of ttl from now, attempt i
// holding the worker token whose hash is tokenHashes[i]. It writes them
// in bulk, 500 rows a statement, for a benchmark that needs many
// live leases at once (cmd/bench's renewal storm) and would otherwise
// spend minutes claiming them one by one. Ids are prefix+"c"+i (the
// conversation), prefix+"j"+i (the job) and prefix+"a"+i (the attempt),
// i from 1. It returns the job ids, in the order of tokenHashes.
func (s *Store) SeedLeases(ctx context.Context, hostID, hostName, prefix string, tokenHashes [][]byte, ttl time.Duration, now time.Time) ([]string, error) {
	const perStatement = 500 // 8 parameters a row: within both dialects' limits
	n := len(tokenHashes)
	exp := now.Add(ttl)
	for from := 0; from < n; from += perStatement {
		to := min(from+perStatement, n)
		err := s.write(ctx, func(tx txn) error {
			if _, err := s.exec(ctx, tx, `INSERT INTO conversations (id, agent_command, state, next_seq, created_at, updated_at) `+seedSeries+
				`SELECT ? || 'c' || (i + ?), '["agent"]', 'usable', 1, ?, ? FROM n`, to-from, prefix, from, ns(now), ns(now)); err != nil {
				return err
			}
			if _, err := s.exec(ctx, tx, `INSERT INTO jobs (id, conversation_id, seq, prompt, state, head, generation, attempt_count,
				live_attempt_id, created_at) `+seedSeries+`SELECT ? || 'j' || (i + ?), ? || 'c' || (i + ?), 1, 'p', 'running', 1, 1, 1,
				? || 'a' || (i + ?), ? FROM n`, to-from, prefix, from, prefix, from, prefix, from, ns(now)); err != nil {
				return err
			}
			var b strings.Builder
			b.WriteString(`INSERT INTO attempts (id, job_id, generation, state, host_id, lease_owner, lease_ttl,
				lease_expires_at, claimed_at, token_hash) VALUES `)
			args := make([]any, 0, 8*(to-from))
			for i := from; i < to; i++ {
				if i > from {
					b.WriteByte(',')
				}
				b.WriteString(`(?, ?, 1, 'running', ?, ?, ?, ?, ?, ?)`)
				args = append(args, fmt.Sprintf("%sa%d", prefix, i+1), fmt.Sprintf("%sj%d", prefix, i+1),
					hostID, hostName, int64(ttl), ns(exp), ns(now), hex.EncodeToString(tokenHashes[i])) // as Claim keeps it
			}
			_, err := s.exec(ctx, tx, b.String(), args...)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("seed leases %d–%d: %w", from+1, to, err)
		}
	}
	jobs := make([]string, n)
	for i := range jobs {
		jobs[i] = fmt.Sprintf("%sj%d", prefix, i+1)
	}
	return jobs, nil
}
