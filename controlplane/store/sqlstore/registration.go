package sqlstore

import (
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// CreateRegistrationToken stores a new registration token's hash with what
// it grants.
func (s *Store) CreateRegistrationToken(ctx context.Context, t store.RegistrationToken, tokenHash []byte, a store.Audit, now time.Time) (store.RegistrationToken, error) {
	if strings.TrimSpace(t.Name) == "" || len(tokenHash) == 0 || t.MaxUses < 0 {
		return store.RegistrationToken{}, fmt.Errorf("create registration token: %w: a name, a token hash and max uses of 0 or more are required", store.ErrInvalid)
	}
	if err := t.Labels.Check(); err != nil {
		return store.RegistrationToken{}, fmt.Errorf("create registration token: %w: labels: %w", store.ErrInvalid, err)
	}
	t.ID, t.Uses, t.CreatedAt, t.RevokedAt = newID("rtok"), 0, fromNS(ns(now)), nil
	var expires sql.NullInt64
	if t.ExpiresAt != nil {
		expires = sql.NullInt64{Int64: ns(*t.ExpiresAt), Valid: true}
		t.ExpiresAt = nsPtr(expires)
	}
	err := s.write(ctx, func(tx txn) error {
		_, err := s.exec(ctx, tx, `INSERT INTO registration_tokens (id, name, token_hash, labels, max_uses, expires_at, created_at)
			VALUES (?, ?, ?, ?, ?, ?, ?)`, t.ID, t.Name, hex.EncodeToString(tokenHash), t.Labels.String(), t.MaxUses, expires, ns(now))
		if err != nil {
			return err
		}
		return s.writeAudit(ctx, tx, audited{a, wire.AuditRegistrationTokenCreate, t.ID, now})
	})
	if err != nil && isUniqueViolation(err) {
		err = store.ErrExists // the same token twice
	}
	if err != nil {
		return store.RegistrationToken{}, fmt.Errorf("create registration token: %w", err)
	}
	return t, nil
}

const registrationTokenCols = `id, name, labels, max_uses, uses, expires_at, created_at, revoked_at`

func scanRegistrationToken(sc interface{ Scan(...any) error }) (store.RegistrationToken, error) {
	var t store.RegistrationToken
	var labels string
	var maxUses, uses, created int64
	var expires, revoked sql.NullInt64
	if err := sc.Scan(&t.ID, &t.Name, &labels, &maxUses, &uses, &expires, &created, &revoked); err != nil {
		return t, err
	}
	var err error
	if t.Labels, err = wire.ParseLabels(labels); err != nil {
		return t, fmt.Errorf("labels of registration token %s: %w", t.ID, err)
	}
	t.MaxUses, t.Uses = int(maxUses), int(uses)
	t.ExpiresAt, t.CreatedAt, t.RevokedAt = nsPtr(expires), fromNS(created), nsPtr(revoked)
	return t, nil
}

// ListRegistrationTokens lists every registration token, oldest first.
func (s *Store) ListRegistrationTokens(ctx context.Context) ([]store.RegistrationToken, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+registrationTokenCols+` FROM registration_tokens ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list registration tokens: %w", err)
	}
	defer rows.Close()
	out := []store.RegistrationToken{}
	for rows.Next() {
		t, err := scanRegistrationToken(rows)
		if err != nil {
			return nil, fmt.Errorf("list registration tokens: %w", err)
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// RevokeRegistrationToken marks the token revoked, once: only the first
// revocation is audited. The hosts it registered keep their own tokens.
func (s *Store) RevokeRegistrationToken(ctx context.Context, id string, a store.Audit, now time.Time) (store.RegistrationToken, error) {
	var t store.RegistrationToken
	err := s.write(ctx, func(tx txn) error {
		var err error
		t, err = scanRegistrationToken(tx.QueryRowContext(ctx, s.q(`UPDATE registration_tokens SET revoked_at = COALESCE(revoked_at, ?)
			WHERE id = ? RETURNING `+registrationTokenCols), ns(now), id))
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return store.ErrNotFound
		case err != nil || !t.RevokedAt.Equal(fromNS(ns(now))):
			return err // revoked before: nothing done, nothing audited
		}
		return s.writeAudit(ctx, tx, audited{a, wire.AuditRegistrationTokenRevoke, id, now})
	})
	if err != nil {
		return store.RegistrationToken{}, fmt.Errorf("revoke registration token: %w", err)
	}
	return t, nil
}

// RegistrationActor is the audit's actor of a registration with t: the
// registration token's name and id (names need not be unique).
func RegistrationActor(t store.RegistrationToken) string {
	return "registration:" + t.Name + "/" + t.ID
}

// RegisterHost checks the registration token (locked on PostgreSQL, so
// that two registrations cannot both take its last use), registers the
// host and counts the use, in one transaction.
func (s *Store) RegisterHost(ctx context.Context, registrationHash []byte, name string, labels wire.Labels, hostTokenHash []byte, now time.Time) (store.Host, error) {
	if strings.TrimSpace(name) == "" || len(hostTokenHash) == 0 {
		return store.Host{}, fmt.Errorf("register host: %w: name and token hash are required", store.ErrInvalid)
	}
	if err := labels.Check(); err != nil {
		return store.Host{}, fmt.Errorf("register host: %w: labels: %w", store.ErrInvalid, err)
	}
	lock := ""
	if s.d == postgres {
		lock = " FOR UPDATE"
	}
	var h store.Host
	err := s.write(ctx, func(tx txn) error {
		t, err := scanRegistrationToken(tx.QueryRowContext(ctx, s.q(`SELECT `+registrationTokenCols+
			` FROM registration_tokens WHERE token_hash = ?`+lock), hex.EncodeToString(registrationHash)))
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return store.ErrUnauthorized
		case err != nil:
			return err
		case t.RevokedAt != nil:
			return store.ErrUnauthorized
		case t.ExpiresAt != nil && !now.Before(*t.ExpiresAt):
			return store.ErrRegistrationExpired
		case t.MaxUses > 0 && t.Uses >= t.MaxUses:
			return store.ErrRegistrationUsedUp
		}
		for _, k := range slices.Sorted(maps.Keys(labels)) {
			if v, ok := t.Labels[k]; !ok || v != labels[k] {
				return fmt.Errorf("%w: %s=%s", store.ErrLabelNotGranted, k, labels[k])
			}
		}
		if h, err = s.createHost(ctx, tx, name, hostTokenHash, t.ID, now); err != nil {
			return err
		}
		if err := s.setHostLabels(ctx, tx, h.ID, labels); err != nil {
			return err
		}
		if _, err = s.exec(ctx, tx, `UPDATE registration_tokens SET uses = uses + 1 WHERE id = ?`, t.ID); err != nil {
			return err
		}
		return s.writeAudit(ctx, tx, audited{store.Audit{Actor: RegistrationActor(t)}, wire.AuditHostRegister, name, now})
	})
	if err != nil && isUniqueViolation(err) {
		err = store.ErrExists // a concurrent registration of the same name
	}
	if err != nil {
		return store.Host{}, fmt.Errorf("register host: %w", err)
	}
	return h, nil
}
