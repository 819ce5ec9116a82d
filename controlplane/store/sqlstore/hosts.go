package sqlstore

import (
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// CreateHost registers a host; only the hash of its token is stored.
func (s *Store) CreateHost(ctx context.Context, name string, tokenHash []byte, now time.Time) (store.Host, error) {
	if strings.TrimSpace(name) == "" || len(tokenHash) == 0 {
		return store.Host{}, fmt.Errorf("create host: %w: name and token hash are required", store.ErrInvalid)
	}
	h := store.Host{ID: newID("host"), Name: name}
	err := s.write(ctx, func(tx txn) error {
		var n int
		if err := tx.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM hosts WHERE name = ?`), name).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return store.ErrExists
		}
		_, err := s.exec(ctx, tx, `INSERT INTO hosts (id, name, token_hash, created_at) VALUES (?, ?, ?, ?)`,
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
	err := s.r.QueryRowContext(ctx, s.q(`SELECT id, name FROM hosts WHERE token_hash = ?`), hex.EncodeToString(tokenHash)).Scan(&h.ID, &h.Name)
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
	var class string
	var consecutive, since int64
	if hb.LaunchError != nil {
		class, consecutive, since = hb.LaunchError.Class, int64(hb.LaunchError.Consecutive), ns(hb.LaunchError.Since)
	}
	return s.write(ctx, func(tx txn) error {
		n, err := s.exec(ctx, tx, `UPDATE hosts SET last_heartbeat = ?, capacity = ?, draining = ?,
			launch_error_class = ?, launch_error_consecutive = ?, launch_error_since = ?, version = ? WHERE id = ?`,
			ns(now), hb.Capacity, b2i(hb.Draining), class, consecutive, since, hb.Version, hostID)
		if err != nil {
			return fmt.Errorf("record heartbeat: %w", err)
		}
		if n == 0 {
			return store.ErrNotFound
		}
		return nil
	})
}

// ListServers lists the hosts by name. Running counts the host's live
// attempts as the store knows them, not as the host reported them.
func (s *Store) ListServers(ctx context.Context) ([]wire.Server, error) {
	rows, err := s.r.QueryContext(ctx, s.q(`SELECT h.name, h.last_heartbeat, h.capacity, h.draining,
		h.launch_error_class, h.launch_error_consecutive, h.launch_error_since, h.version,
		(SELECT COUNT(*) FROM attempts a WHERE a.host_id = h.id AND a.state = 'running')
		FROM hosts h ORDER BY h.name`))
	if err != nil {
		return nil, fmt.Errorf("list servers: %w", err)
	}
	defer rows.Close()
	out := []wire.Server{}
	for rows.Next() {
		var sv wire.Server
		var last sql.NullInt64
		var draining, consecutive, since, running int64
		var class string
		if err := rows.Scan(&sv.Name, &last, &sv.Capacity, &draining, &class, &consecutive, &since, &sv.Version, &running); err != nil {
			return nil, fmt.Errorf("list servers: %w", err)
		}
		sv.LastHeartbeat = nsPtr(last)
		sv.Draining = draining != 0
		sv.Running = int(running)
		if class != "" {
			sv.LaunchError = &wire.LaunchError{Class: class, Consecutive: int(consecutive), Since: fromNS(since)}
		}
		out = append(out, sv)
	}
	return out, rows.Err()
}
