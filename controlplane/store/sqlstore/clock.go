package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Now reads the store's one clock (K3): the database's on PostgreSQL, so
// that every replica judges leases, reaping and absence on the same clock,
// and the process's on SQLite, where the one process is the one clock.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	base := time.Now()
	if s.d == postgres {
		if err := s.r.QueryRowContext(ctx, `SELECT clock_timestamp()`).Scan(&base); err != nil {
			return time.Time{}, fmt.Errorf("read the database clock: %w", err)
		}
	}
	if s.cfg.clock != nil {
		base = s.cfg.clock(base)
	}
	return base.UTC(), nil
}

// leaseLive is the lease half of the fencing condition, on an attempts row
// with two arguments, both now: the lease has not expired, or it expired
// inside the control plane's own absence that no sweep has resumed yet (K3,
// P4). The absence is the database's record: control_plane.last_seen,
// written on the store's clock by every sweep, older than the gap the last
// sweep named. So a request that arrives after a pause or a restart, before
// any sweep, is never refused for an expiry that fell while nobody was
// there to renew.
const leaseLive = `(lease_expires_at > ? OR lease_expires_at > (SELECT cp.last_seen FROM control_plane cp
	WHERE cp.id = 1 AND cp.max_gap > 0 AND cp.last_seen < ? - cp.max_gap))`

// leaseLiveAt is leaseLive judged at the SQL expression now (a
// parameter, or the database's clock: nowSQL) in place of its arguments.
func leaseLiveAt(now string) string { return strings.ReplaceAll(leaseLive, "?", now) }

// dbNow is PostgreSQL's clock in the store's unit (Unix nanoseconds): the
// time the statement reading it began, one instant for all its uses.
const dbNow = `CAST(EXTRACT(EPOCH FROM statement_timestamp()) * 1000000000 AS BIGINT)`

// nowSQL is the now of a statement: with a time given or a test clock
// (WithClock) or on SQLite (whose clock is the process's), a parameter
// holding it; otherwise, on PostgreSQL, the database's clock read inside
// the statement (K3), which saves the round trip of Now.
func (s *Store) nowSQL(ctx context.Context, now time.Time) (expr string, arg []any, err error) {
	if now.IsZero() && s.d == postgres && s.cfg.clock == nil {
		return dbNow, nil, nil
	}
	if now.IsZero() {
		if now, err = s.Now(ctx); err != nil {
			return "", nil, err
		}
	}
	return "CAST(? AS BIGINT)", []any{ns(now)}, nil
}

// errRaced says a guarded write changed nothing although its attempt is
// live when read again: on PostgreSQL a concurrent transaction (a sweep
// resuming leases after an absence) committed between the statement's
// snapshot and the read. The transaction runs again; it is never an answer.
var errRaced = errors.New("the attempt changed while it was written")

// absence reads the database's record of the control plane's last sign of
// life and reports whether now lies past it by more than its gap: an
// absence no sweep has resumed yet. last is 0 when no sweep ran.
func (s *Store) absence(ctx context.Context, tx txn, now time.Time, lock bool) (last int64, absent bool, err error) {
	var gap int64
	q := `SELECT last_seen, max_gap FROM control_plane WHERE id = 1`
	if lock {
		q += s.lockRow()
	}
	err = tx.QueryRowContext(ctx, q).Scan(&last, &gap)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	return last, gap > 0 && ns(now)-last > gap, nil
}
