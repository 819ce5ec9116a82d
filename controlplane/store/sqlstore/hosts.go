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

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// CreateHost registers a host; only the hash of its token is stored. The
// name of a removed host registers it anew: the same row and id (its
// attempts name it), a new token, nothing of what it last said.
func (s *Store) CreateHost(ctx context.Context, name string, tokenHash []byte, now time.Time) (store.Host, error) {
	if strings.TrimSpace(name) == "" || len(tokenHash) == 0 {
		return store.Host{}, fmt.Errorf("create host: %w: name and token hash are required", store.ErrInvalid)
	}
	h := store.Host{ID: newID("host"), Name: name}
	err := s.write(ctx, func(tx txn) error {
		var id string
		var removed sql.NullInt64
		err := tx.QueryRowContext(ctx, s.q(`SELECT id, removed_at FROM hosts WHERE name = ?`), name).Scan(&id, &removed)
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return err
		case !removed.Valid:
			return store.ErrExists
		default:
			h.ID = id
			_, err := s.exec(ctx, tx, `UPDATE hosts SET token_hash = ?, removed_at = NULL, paused_at = NULL,
				last_heartbeat = NULL, capacity = 0, draining = 0, launch_error_class = '', launch_error_consecutive = 0,
				launch_error_since = 0, version = '', heartbeat_interval_ms = 0, claims_withheld = '', labels = '', sandbox_pressure = '' WHERE id = ?`,
				hex.EncodeToString(tokenHash), id)
			if err != nil {
				return err
			}
			_, err = s.exec(ctx, tx, `DELETE FROM host_labels WHERE host_id = ?`, id)
			return err
		}
		_, err = s.exec(ctx, tx, `INSERT INTO hosts (id, name, token_hash, created_at) VALUES (?, ?, ?, ?)`,
			h.ID, name, hex.EncodeToString(tokenHash), ns(now))
		return err
	})
	if err != nil && isUniqueViolation(err) {
		err = store.ErrExists // a concurrent CreateHost of the same name
	}
	if err != nil {
		return store.Host{}, fmt.Errorf("create host: %w", err)
	}
	return h, nil
}

// HostByTokenHash finds the host holding a token; ErrUnauthorized if none.
func (s *Store) HostByTokenHash(ctx context.Context, tokenHash []byte) (store.Host, error) {
	var h store.Host
	err := s.r.QueryRowContext(ctx, s.q(`SELECT id, name, paused_at IS NOT NULL FROM hosts WHERE token_hash = ? AND removed_at IS NULL`),
		hex.EncodeToString(tokenHash)).Scan(&h.ID, &h.Name, &h.Paused)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Host{}, store.ErrUnauthorized
	}
	if err != nil {
		return store.Host{}, fmt.Errorf("host by token: %w", err)
	}
	return h, nil
}

// RecordHostHeartbeat stores what the host last said about itself (R37).
func (s *Store) RecordHostHeartbeat(ctx context.Context, hostID string, hb wire.HostHeartbeat, now time.Time) error {
	if err := hb.Labels.Check(); err != nil {
		return fmt.Errorf("record heartbeat: %w: labels: %w", store.ErrInvalid, err)
	}
	var class string
	var consecutive, since int64
	if hb.LaunchError != nil {
		class, consecutive, since = hb.LaunchError.Class, int64(hb.LaunchError.Consecutive), ns(hb.LaunchError.Since)
	}
	var pressure string
	if hb.SandboxPressure != nil {
		b, err := json.Marshal(hb.SandboxPressure)
		if err != nil {
			return fmt.Errorf("record heartbeat: %w", err)
		}
		pressure = string(b)
	}
	return s.write(ctx, func(tx txn) error {
		n, err := s.exec(ctx, tx, `UPDATE hosts SET last_heartbeat = ?, capacity = ?, draining = ?,
			launch_error_class = ?, launch_error_consecutive = ?, launch_error_since = ?, version = ?,
			heartbeat_interval_ms = ?, claims_withheld = ?, sandbox_pressure = ? WHERE id = ? AND removed_at IS NULL`,
			ns(now), hb.Capacity, b2i(hb.Draining), class, consecutive, since, hb.Version, max(hb.IntervalMS, 0), hb.ClaimsWithheld,
			pressure, hostID)
		if err != nil {
			return fmt.Errorf("record heartbeat: %w", err)
		}
		if n == 0 {
			return store.ErrNotFound
		}
		return s.setHostLabels(ctx, tx, hostID, hb.Labels)
	})
}

// ListServers lists the hosts by name. Running counts the host's live
// attempts as the store knows them, not as the host reported them.
func (s *Store) ListServers(ctx context.Context) ([]wire.Server, error) {
	rows, err := s.r.QueryContext(ctx, s.q(`SELECT h.name, h.last_heartbeat, h.capacity, h.draining,
		h.launch_error_class, h.launch_error_consecutive, h.launch_error_since, h.version,
		(SELECT COUNT(*) FROM attempts a WHERE a.host_id = h.id AND a.state = 'running'),
		h.paused_at, h.heartbeat_interval_ms, h.claims_withheld, h.labels, h.sandbox_pressure
		FROM hosts h WHERE h.removed_at IS NULL ORDER BY h.name`))
	if err != nil {
		return nil, fmt.Errorf("list servers: %w", err)
	}
	defer rows.Close()
	out := []wire.Server{}
	for rows.Next() {
		var sv wire.Server
		var last, paused sql.NullInt64
		var draining, consecutive, since, running int64
		var class, labels, pressure string
		if err := rows.Scan(&sv.Name, &last, &sv.Capacity, &draining, &class, &consecutive, &since, &sv.Version, &running,
			&paused, &sv.HeartbeatIntervalMS, &sv.ClaimsWithheld, &labels, &pressure); err != nil {
			return nil, fmt.Errorf("list servers: %w", err)
		}
		var err error
		if sv.Labels, err = wire.ParseLabels(labels); err != nil {
			return nil, fmt.Errorf("list servers: labels of %s: %w", sv.Name, err)
		}
		if pressure != "" {
			sv.SandboxPressure = new(wire.SandboxPressure)
			if err := json.Unmarshal([]byte(pressure), sv.SandboxPressure); err != nil {
				return nil, fmt.Errorf("list servers: sandbox pressure of %s: %w", sv.Name, err)
			}
		}
		sv.LastHeartbeat = nsPtr(last)
		sv.PausedAt = nsPtr(paused)
		sv.Draining = draining != 0
		sv.Running = int(running)
		if class != "" {
			sv.LaunchError = &wire.LaunchError{Class: class, Consecutive: int(consecutive), Since: fromNS(since)}
		}
		out = append(out, sv)
	}
	return out, rows.Err()
}

// PauseHost pauses or resumes the named live host. Pausing a paused host
// keeps the time it was first paused.
func (s *Store) PauseHost(ctx context.Context, name string, paused bool, now time.Time) error {
	q := `UPDATE hosts SET paused_at = NULL WHERE name = ? AND removed_at IS NULL`
	args := []any{name}
	if paused {
		q = `UPDATE hosts SET paused_at = COALESCE(paused_at, ?) WHERE name = ? AND removed_at IS NULL`
		args = []any{ns(now), name}
	}
	return s.hostWrite(ctx, "pause host", q, args...)
}

// RemoveHost marks the named host removed and replaces its token hash by
// a tombstone no hash can equal, in one statement.
func (s *Store) RemoveHost(ctx context.Context, name string, now time.Time) error {
	return s.hostWrite(ctx, "remove host", `UPDATE hosts SET removed_at = ?, paused_at = NULL, token_hash = 'removed:' || id
		WHERE name = ? AND removed_at IS NULL`, ns(now), name)
}

// RotateHostToken replaces the named live host's token hash.
func (s *Store) RotateHostToken(ctx context.Context, name string, tokenHash []byte, now time.Time) error {
	if len(tokenHash) == 0 {
		return fmt.Errorf("rotate host token: %w: the token hash is required", store.ErrInvalid)
	}
	return s.hostWrite(ctx, "rotate host token", `UPDATE hosts SET token_hash = ? WHERE name = ? AND removed_at IS NULL`,
		hex.EncodeToString(tokenHash), name)
}

// hostWrite runs one UPDATE of a host row; no row is ErrNotFound.
func (s *Store) hostWrite(ctx context.Context, op, query string, args ...any) error {
	err := s.write(ctx, func(tx txn) error {
		n, err := s.exec(ctx, tx, query, args...)
		if err != nil {
			return err
		}
		if n == 0 {
			return store.ErrNotFound
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}

// hostClaims reports, inside a claim's transaction, whether the host may
// be given a turn: it is neither paused nor removed. On PostgreSQL the row
// is share-locked, so a pause that answered was committed before any claim
// that could still see the host unpaused.
func (s *Store) hostClaims(ctx context.Context, tx txn, hostID string) (bool, error) {
	lock := ""
	if s.d == postgres {
		lock = " FOR SHARE"
	}
	var open bool
	err := tx.QueryRowContext(ctx, s.q(`SELECT paused_at IS NULL AND removed_at IS NULL FROM hosts WHERE id = ?`+lock), hostID).Scan(&open)
	if errors.Is(err, sql.ErrNoRows) {
		return false, store.ErrNotFound
	}
	return open, err
}
