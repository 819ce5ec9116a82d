package sqlstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
)

// audited is the audit row an admin action writes in its transaction.
type audited struct {
	store.Audit
	action, target string
	at             time.Time
}

// writeAudit writes a's row inside tx, the action's own transaction: the
// action and its row commit together or not at all. An
// action with no actor is refused, so that none goes unattributed.
func (s *Store) writeAudit(ctx context.Context, tx txn, a audited) error {
	if a.Actor == "" {
		return fmt.Errorf("%w: an audited action needs its actor", store.ErrInvalid)
	}
	_, err := s.exec(ctx, tx, `INSERT INTO audit_log (at, actor, action, target, reason) VALUES (?, ?, ?, ?, ?)`,
		ns(a.at), a.Actor, a.action, a.target, a.Reason)
	return err
}

// ListAudit lists the rows f selects, newest first.
func (s *Store) ListAudit(ctx context.Context, f store.AuditFilter) ([]store.AuditEntry, error) {
	var where []string
	var args []any
	if f.Target != "" {
		where, args = append(where, "target = ?"), append(args, f.Target)
	}
	if f.Action != "" {
		where, args = append(where, "action = ?"), append(args, f.Action)
	}
	if !f.Since.IsZero() {
		where, args = append(where, "at >= ?"), append(args, ns(f.Since))
	}
	if f.Before > 0 {
		where, args = append(where, "id < ?"), append(args, f.Before)
	}
	q := `SELECT id, at, actor, action, target, reason FROM audit_log`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	q += ` ORDER BY id DESC`
	if f.Limit > 0 {
		q += fmt.Sprintf(` LIMIT %d`, f.Limit)
	}
	rows, err := s.r.QueryContext(ctx, s.q(q), args...)
	if err != nil {
		return nil, fmt.Errorf("list audit: %w", err)
	}
	defer rows.Close()
	out := []store.AuditEntry{}
	for rows.Next() {
		var e store.AuditEntry
		var at int64
		if err := rows.Scan(&e.ID, &at, &e.Actor, &e.Action, &e.Target, &e.Reason); err != nil {
			return nil, fmt.Errorf("list audit: %w", err)
		}
		e.At = fromNS(at)
		out = append(out, e)
	}
	return out, rows.Err()
}
