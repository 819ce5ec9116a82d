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
func (s *Store) CreateHost(ctx context.Context, name string, tokenHash []byte, a store.Audit, now time.Time) (store.Host, error) {
	if strings.TrimSpace(name) == "" || len(tokenHash) == 0 {
		return store.Host{}, fmt.Errorf("create host: %w: name and token hash are required", store.ErrInvalid)
	}
	var h store.Host
	err := s.write(ctx, func(tx txn) error {
		var err error
		if h, err = s.createHost(ctx, tx, name, tokenHash, "", now); err != nil {
			return err
		}
		return s.writeAudit(ctx, tx, audited{a, wire.AuditHostAdd, name, now})
	})
	if err != nil && isUniqueViolation(err) {
		err = store.ErrExists // a concurrent CreateHost of the same name
	}
	if err != nil {
		return store.Host{}, fmt.Errorf("create host: %w", err)
	}
	return h, nil
}

// createHost is CreateHost inside tx; registeredBy is the registration
// token's id, "" for a host added by hand.
func (s *Store) createHost(ctx context.Context, tx txn, name string, tokenHash []byte, registeredBy string, now time.Time) (store.Host, error) {
	h := store.Host{ID: newID("host"), Name: name}
	var id string
	var removed sql.NullInt64
	err := tx.QueryRowContext(ctx, s.q(`SELECT id, removed_at FROM hosts WHERE name = ?`), name).Scan(&id, &removed)
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return h, err
	case !removed.Valid:
		return h, store.ErrExists
	default:
		h.ID = id
		_, err := s.exec(ctx, tx, `UPDATE hosts SET token_hash = ?, removed_at = NULL, paused_at = NULL,
			last_heartbeat = NULL, capacity = 0, draining = 0, launch_error_class = '', launch_error_consecutive = 0,
			launch_error_since = 0, version = '', heartbeat_interval_ms = 0, claims_withheld = '', labels = '', sandbox_pressure = '',
			previous_token_hash = NULL, previous_token_until = NULL, rotation_nonce = '', registered_by = ?,
			instance_id = '', instance_boot_id = '', instance_seen = NULL, instance_stopping = 0,
			conflict_instance_id = '', conflict_boot_id = '', conflict_seen = NULL WHERE id = ?`,
			hex.EncodeToString(tokenHash), registeredBy, id)
		if err != nil {
			return h, err
		}
		_, err = s.exec(ctx, tx, `DELETE FROM host_labels WHERE host_id = ?`, id)
		return h, err
	}
	_, err = s.exec(ctx, tx, `INSERT INTO hosts (id, name, token_hash, created_at, registered_by) VALUES (?, ?, ?, ?, ?)`,
		h.ID, name, hex.EncodeToString(tokenHash), ns(now), registeredBy)
	return h, err
}

// HostByTokenHash finds the host holding a token, or whose previous token
// it is (Host.Previous, whether or not its grace is over: the caller
// judges); ErrUnauthorized if none.
func (s *Store) HostByTokenHash(ctx context.Context, tokenHash []byte) (store.Host, error) {
	var h store.Host
	var current bool
	var until sql.NullInt64
	var nonce string
	hash := hex.EncodeToString(tokenHash)
	err := s.r.QueryRowContext(ctx, s.q(`SELECT id, name, paused_at IS NOT NULL, token_hash = ?, previous_token_until, rotation_nonce
		FROM hosts WHERE (token_hash = ? OR previous_token_hash = ?) AND removed_at IS NULL`),
		hash, hash, hash).Scan(&h.ID, &h.Name, &h.Paused, &current, &until, &nonce)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Host{}, store.ErrUnauthorized
	}
	if err != nil {
		return store.Host{}, fmt.Errorf("host by token: %w", err)
	}
	if !current {
		if !until.Valid || nonce == "" {
			return store.Host{}, store.ErrUnauthorized
		}
		h.Previous = &store.PreviousToken{Until: fromNS(until.Int64), Nonce: nonce}
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

// UseHostInstance lets in act for the host or refuses it
// ErrHostTokenInUse, recording the refusal as the host's conflict (see
// store.Store). The live instance's own claims are answered from a read;
// everything else is one write transaction, the host's row locked on
// PostgreSQL, so that two replicas never both let two instances in.
func (s *Store) UseHostInstance(ctx context.Context, hostID string, in store.Instance, beat bool, now time.Time) error {
	if in.ID == "" {
		return fmt.Errorf("use host instance: %w: the instance id is required", store.ErrInvalid)
	}
	if !beat {
		var cur string
		err := s.r.QueryRowContext(ctx, s.q(`SELECT instance_id FROM hosts WHERE id = ? AND removed_at IS NULL`), hostID).Scan(&cur)
		if errors.Is(err, sql.ErrNoRows) {
			return store.ErrNotFound
		}
		if err != nil {
			return fmt.Errorf("use host instance: %w", err)
		}
		if cur == in.ID {
			return nil
		}
	}
	lock := ""
	if s.d == postgres {
		lock = " FOR UPDATE"
	}
	refused := false
	err := s.write(ctx, func(tx txn) error {
		refused = false
		var cur, boot string
		var seen sql.NullInt64
		var stopping, interval int64
		err := tx.QueryRowContext(ctx, s.q(`SELECT instance_id, instance_boot_id, instance_seen, instance_stopping, heartbeat_interval_ms
			FROM hosts WHERE id = ? AND removed_at IS NULL`+lock), hostID).Scan(&cur, &boot, &seen, &stopping, &interval)
		if errors.Is(err, sql.ErrNoRows) {
			return store.ErrNotFound
		}
		if err != nil {
			return err
		}
		bound := wire.Server{HeartbeatIntervalMS: interval}.OfflineAfter()
		live := cur != "" && cur != in.ID && stopping == 0 && seen.Valid && now.Sub(fromNS(seen.Int64)) <= bound &&
			(boot == "" || boot != in.BootID)
		switch {
		case live:
			refused = true
			_, err = s.exec(ctx, tx, `UPDATE hosts SET conflict_instance_id = ?, conflict_boot_id = ?, conflict_seen = ? WHERE id = ?`,
				in.ID, in.BootID, ns(now), hostID)
			return err
		case cur == in.ID && !beat:
			return nil
		case cur == in.ID:
			_, err = s.exec(ctx, tx, `UPDATE hosts SET instance_boot_id = ?, instance_seen = ?, instance_stopping = ? WHERE id = ?`,
				in.BootID, ns(now), b2i(in.Stopping), hostID)
			return err
		}
		// A takeover: none was live, the live one stops or was silent past
		// the offline bound, or this is its machine's restart. The
		// newcomer's own refusals are over.
		_, err = s.exec(ctx, tx, `UPDATE hosts SET instance_id = ?, instance_boot_id = ?, instance_seen = ?, instance_stopping = ?,
			conflict_instance_id = CASE WHEN conflict_instance_id = ? THEN '' ELSE conflict_instance_id END,
			conflict_boot_id = CASE WHEN conflict_instance_id = ? THEN '' ELSE conflict_boot_id END,
			conflict_seen = CASE WHEN conflict_instance_id = ? THEN NULL ELSE conflict_seen END WHERE id = ?`,
			in.ID, in.BootID, ns(now), b2i(in.Stopping), in.ID, in.ID, in.ID, hostID)
		return err
	})
	if err != nil {
		return fmt.Errorf("use host instance: %w", err)
	}
	if refused {
		return store.ErrHostTokenInUse
	}
	return nil
}

// ListServers lists the hosts by name. Running counts the host's live
// attempts as the store knows them, not as the host reported them.
func (s *Store) ListServers(ctx context.Context) ([]wire.Server, error) {
	rows, err := s.r.QueryContext(ctx, s.q(`SELECT h.name, h.last_heartbeat, h.capacity, h.draining,
		h.launch_error_class, h.launch_error_consecutive, h.launch_error_since, h.version,
		(SELECT COUNT(*) FROM attempts a WHERE a.host_id = h.id AND a.state = 'running'),
		h.paused_at, h.paused_by, h.pause_reason, h.heartbeat_interval_ms, h.claims_withheld, h.labels, h.sandbox_pressure,
		h.instance_id, h.instance_boot_id, h.instance_seen, h.instance_stopping,
		h.conflict_instance_id, h.conflict_boot_id, h.conflict_seen
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
		var inst, other wire.HostInstance
		var instSeen, otherSeen sql.NullInt64
		var stopping int64
		if err := rows.Scan(&sv.Name, &last, &sv.Capacity, &draining, &class, &consecutive, &since, &sv.Version, &running,
			&paused, &sv.PausedBy, &sv.PauseReason, &sv.HeartbeatIntervalMS, &sv.ClaimsWithheld, &labels, &pressure,
			&inst.ID, &inst.BootID, &instSeen, &stopping, &other.ID, &other.BootID, &otherSeen); err != nil {
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
		if inst.ID != "" && instSeen.Valid {
			inst.LastSeen, inst.Stopping = fromNS(instSeen.Int64), stopping != 0
			sv.Instance = &inst
		}
		if other.ID != "" && otherSeen.Valid {
			other.LastSeen = fromNS(otherSeen.Int64)
			sv.Conflict = &other // the caller, who knows the time, drops an old one
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
func (s *Store) PauseHost(ctx context.Context, name string, paused bool, a store.Audit, now time.Time) error {
	q := `UPDATE hosts SET paused_at = NULL, paused_by = '', pause_reason = '' WHERE name = ? AND removed_at IS NULL`
	args := []any{name}
	action := wire.AuditHostResume
	if paused {
		// A pause of a paused host keeps the first's time, actor and reason.
		q = `UPDATE hosts SET paused_at = COALESCE(paused_at, ?),
			paused_by = CASE WHEN paused_at IS NULL THEN ? ELSE paused_by END,
			pause_reason = CASE WHEN paused_at IS NULL THEN ? ELSE pause_reason END
			WHERE name = ? AND removed_at IS NULL`
		args = []any{ns(now), a.Actor, a.Reason, name}
		action = wire.AuditHostPause
	}
	return s.hostWrite(ctx, "pause host", &audited{a, action, name, now}, q, args...)
}

// RemoveHost marks the named host removed and replaces its token hash by
// a tombstone no hash can equal, in one statement.
func (s *Store) RemoveHost(ctx context.Context, name string, a store.Audit, now time.Time) error {
	return s.hostWrite(ctx, "remove host", &audited{a, wire.AuditHostRemove, name, now}, `UPDATE hosts SET removed_at = ?, paused_at = NULL, token_hash = 'removed:' || id, previous_token_hash = NULL, rotation_nonce = ''
		WHERE name = ? AND removed_at IS NULL`, ns(now), name)
}

// RotateHostToken replaces the named live host's token: at once, or
// through a grace in which the current token stays valid and the new one
// is the host's to derive and adopt (AdoptRotatedToken). A rotation inside
// another's grace that the host has not adopted yet keeps the token the
// host holds as the previous one.
func (s *Store) RotateHostToken(ctx context.Context, name string, r store.HostRotation, a store.Audit, now time.Time) error {
	au := &audited{a, wire.AuditHostRotateToken, name, now}
	if r.GraceUntil.IsZero() {
		if len(r.TokenHash) == 0 {
			return fmt.Errorf("rotate host token: %w: the token hash is required", store.ErrInvalid)
		}
		return s.hostWrite(ctx, "rotate host token", au, `UPDATE hosts SET token_hash = ?, previous_token_hash = NULL,
			previous_token_until = NULL, rotation_nonce = '' WHERE name = ? AND removed_at IS NULL`,
			hex.EncodeToString(r.TokenHash), name)
	}
	if r.Nonce == "" || !r.GraceUntil.After(now) {
		return fmt.Errorf("rotate host token: %w: a grace needs a nonce and an end after now", store.ErrInvalid)
	}
	return s.hostWrite(ctx, "rotate host token", au, `UPDATE hosts SET
		previous_token_hash = CASE WHEN token_hash = 'rotating:' || id THEN previous_token_hash ELSE token_hash END,
		token_hash = 'rotating:' || id, previous_token_until = ?, rotation_nonce = ?
		WHERE name = ? AND removed_at IS NULL`, ns(r.GraceUntil), r.Nonce, name)
}

// AdoptRotatedToken makes newHash the token of the host whose previous
// token is previousHash.
func (s *Store) AdoptRotatedToken(ctx context.Context, hostID string, previousHash, newHash []byte) error {
	if len(newHash) == 0 {
		return fmt.Errorf("adopt rotated token: %w: the token hash is required", store.ErrInvalid)
	}
	return s.hostWrite(ctx, "adopt rotated token", nil, `UPDATE hosts SET token_hash = ?
		WHERE id = ? AND previous_token_hash = ? AND removed_at IS NULL`,
		hex.EncodeToString(newHash), hostID, hex.EncodeToString(previousHash))
}

// hostWrite runs one UPDATE of a host row; no row is ErrNotFound.
func (s *Store) hostWrite(ctx context.Context, op string, a *audited, query string, args ...any) error {
	err := s.write(ctx, func(tx txn) error {
		n, err := s.exec(ctx, tx, query, args...)
		if err != nil {
			return err
		}
		if n == 0 {
			return store.ErrNotFound
		}
		if a == nil { // the host's own act, no admin's
			return nil
		}
		return s.writeAudit(ctx, tx, *a)
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
