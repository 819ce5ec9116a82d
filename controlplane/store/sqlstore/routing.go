package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// requirements are the labels a conversation's turns need: the request's,
// with sandbox=<Sandbox> when it named a backend (a Docker conversation is
// never given to a process-sandbox host, and the other way round).
func requirements(req wire.CreateConversationRequest) (wire.Labels, error) {
	l := wire.Labels{}
	for k, v := range req.Requires {
		l[k] = v
	}
	switch req.Sandbox {
	case "":
	case wire.SandboxDocker, wire.SandboxProcess:
		if v, ok := l[wire.LabelSandbox]; ok && v != req.Sandbox {
			return nil, fmt.Errorf("sandbox %q and requires sandbox=%s disagree", req.Sandbox, v)
		}
		l[wire.LabelSandbox] = req.Sandbox
	default:
		return nil, fmt.Errorf("sandbox must be %q or %q", wire.SandboxDocker, wire.SandboxProcess)
	}
	if err := l.Check(); err != nil {
		return nil, fmt.Errorf("requires: %w", err)
	}
	return l, nil
}

// ensureRoute records the route of a requirement set once: its row, and
// one row per label for the claim's match.
func (s *Store) ensureRoute(ctx context.Context, tx txn, route string, l wire.Labels) error {
	n, err := s.exec(ctx, tx, `INSERT INTO routes (labels) VALUES (?) ON CONFLICT (labels) DO NOTHING`, route)
	if err != nil || n == 0 {
		return err
	}
	for k, v := range l {
		if _, err := s.exec(ctx, tx, `INSERT INTO route_labels (route, key, value) VALUES (?, ?, ?)`, route, k, v); err != nil {
			return err
		}
	}
	return nil
}

// setHostLabels replaces the host's labels when they changed since its
// last heartbeat (the usual case costs the one UPDATE that finds no row).
func (s *Store) setHostLabels(ctx context.Context, tx txn, hostID string, l wire.Labels) error {
	labels := l.String()
	n, err := s.exec(ctx, tx, `UPDATE hosts SET labels = ? WHERE id = ? AND labels <> ?`, labels, hostID, labels)
	if err != nil || n == 0 {
		return err
	}
	if _, err := s.exec(ctx, tx, `DELETE FROM host_labels WHERE host_id = ?`, hostID); err != nil {
		return err
	}
	for k, v := range l {
		if _, err := s.exec(ctx, tx, `INSERT INTO host_labels (host_id, key, value) VALUES (?, ?, ?)`, hostID, k, v); err != nil {
			return err
		}
	}
	return nil
}

// SweepRoutes judges every route against the labels of the hosts online
// at now (wire.HostState: not offline, paused or draining): a route no
// such host meets is marked unroutable with the labels the closest one
// lacks, since the first sweep that found it so; a route some host meets
// is cleared. It returns how many routes are unroutable.
func (s *Store) SweepRoutes(ctx context.Context, now time.Time) (int, error) {
	servers, err := s.ListServers(ctx)
	if err != nil {
		return 0, fmt.Errorf("sweep routes: %w", err)
	}
	var live []wire.Labels
	for _, sv := range servers {
		if wire.HostState(sv, now) == wire.HostOnline {
			live = append(live, sv.Labels)
		}
	}
	rows, err := s.r.QueryContext(ctx, `SELECT labels, unroutable FROM routes`)
	if err != nil {
		return 0, fmt.Errorf("sweep routes: %w", err)
	}
	type verdict struct {
		route string
		was   sql.NullString
		now   *string // nil: routable
	}
	var vs []verdict
	for rows.Next() {
		var v verdict
		if err := rows.Scan(&v.route, &v.was); err != nil {
			rows.Close()
			return 0, fmt.Errorf("sweep routes: %w", err)
		}
		vs = append(vs, v)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("sweep routes: %w", err)
	}
	unroutable := 0
	err = s.write(ctx, func(tx txn) error {
		unroutable = 0
		for _, v := range vs {
			want, err := wire.ParseLabels(v.route)
			if err != nil {
				return err
			}
			v.now = closestMissing(live, want)
			switch {
			case v.now == nil && !v.was.Valid:
				continue
			case v.now == nil:
				_, err = s.exec(ctx, tx, `UPDATE routes SET unroutable = NULL, unroutable_since = 0 WHERE labels = ?`, v.route)
			case v.was.Valid && v.was.String == *v.now:
				unroutable++
				continue
			default:
				unroutable++
				// A changed verdict keeps the time the route first became unroutable.
				_, err = s.exec(ctx, tx, `UPDATE routes SET unroutable = ?,
					unroutable_since = CASE WHEN unroutable IS NULL THEN ? ELSE unroutable_since END WHERE labels = ?`,
					*v.now, ns(now), v.route)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("sweep routes: %w", err)
	}
	return unroutable, nil
}

// closestMissing is nil when some live host meets want, else the labels
// the live host closest to it lacks ("" with no live host).
func closestMissing(live []wire.Labels, want wire.Labels) *string {
	var best []string
	for i, l := range live {
		m := l.Missing(want)
		if len(m) == 0 {
			return nil
		}
		if i == 0 || len(m) < len(best) {
			best = m
		}
	}
	str := strings.Join(best, ",") // Missing lists them in canonical order
	return &str
}

// jobUnroutable reads the route verdict for a queued job not pinned to a
// sandbox's host (a pinned one goes to its host or nowhere).
func (s *Store) jobUnroutable(ctx context.Context, db querier, jobID string) (*wire.Unroutable, error) {
	var missing string
	var since int64
	err := db.QueryRowContext(ctx, s.q(`SELECT r.unroutable, r.unroutable_since FROM jobs j JOIN routes r ON r.labels = j.route
		WHERE j.id = ? AND j.state = 'queued' AND j.sandbox_host_id IS NULL AND r.unroutable IS NOT NULL`), jobID).Scan(&missing, &since)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	l, err := wire.ParseLabels(missing)
	if err != nil {
		return nil, err
	}
	// Every pair of l, in canonical order ([] when no host is live).
	return &wire.Unroutable{Missing: append([]string{}, wire.Labels{}.Missing(l)...), Since: fromNS(since)}, nil
}
