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

// CreateUserToken stores a new user token's hash under a label.
func (s *Store) CreateUserToken(ctx context.Context, name string, tokenHash []byte, a store.Audit, now time.Time) (store.UserToken, error) {
	if strings.TrimSpace(name) == "" || len(tokenHash) == 0 {
		return store.UserToken{}, fmt.Errorf("create user token: %w: name and token hash are required", store.ErrInvalid)
	}
	t := store.UserToken{ID: newID("utok"), Name: name, CreatedAt: fromNS(ns(now))}
	err := s.write(ctx, func(tx txn) error {
		_, err := s.exec(ctx, tx, `INSERT INTO user_tokens (id, name, token_hash, created_at) VALUES (?, ?, ?, ?)`,
			t.ID, name, hex.EncodeToString(tokenHash), ns(now))
		if err != nil {
			return err
		}
		return s.writeAudit(ctx, tx, audited{a, wire.AuditUserTokenCreate, t.ID, now})
	})
	if err != nil && isUniqueViolation(err) {
		err = store.ErrExists // the same token twice
	}
	if err != nil {
		return store.UserToken{}, fmt.Errorf("create user token: %w", err)
	}
	return t, nil
}

const userTokenCols = `id, name, created_at, revoked_at`

func scanUserToken(sc interface{ Scan(...any) error }) (store.UserToken, error) {
	var t store.UserToken
	var created int64
	var revoked sql.NullInt64
	if err := sc.Scan(&t.ID, &t.Name, &created, &revoked); err != nil {
		return t, err
	}
	t.CreatedAt, t.RevokedAt = fromNS(created), nsPtr(revoked)
	return t, nil
}

// UserTokenByHash finds the token with this hash, revoked or not.
func (s *Store) UserTokenByHash(ctx context.Context, tokenHash []byte) (store.UserToken, error) {
	t, err := scanUserToken(s.r.QueryRowContext(ctx, s.q(`SELECT `+userTokenCols+` FROM user_tokens WHERE token_hash = ?`),
		hex.EncodeToString(tokenHash)))
	if errors.Is(err, sql.ErrNoRows) {
		return store.UserToken{}, store.ErrUnauthorized
	}
	if err != nil {
		return store.UserToken{}, fmt.Errorf("user token by hash: %w", err)
	}
	return t, nil
}

// ListUserTokens lists every user token, oldest first.
func (s *Store) ListUserTokens(ctx context.Context) ([]store.UserToken, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+userTokenCols+` FROM user_tokens ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list user tokens: %w", err)
	}
	defer rows.Close()
	out := []store.UserToken{}
	for rows.Next() {
		t, err := scanUserToken(rows)
		if err != nil {
			return nil, fmt.Errorf("list user tokens: %w", err)
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// RevokeUserToken marks the token revoked, once: only the first
// revocation is audited.
func (s *Store) RevokeUserToken(ctx context.Context, id string, a store.Audit, now time.Time) (store.UserToken, error) {
	var t store.UserToken
	err := s.write(ctx, func(tx txn) error {
		var err error
		t, err = scanUserToken(tx.QueryRowContext(ctx, s.q(`UPDATE user_tokens SET revoked_at = COALESCE(revoked_at, ?)
			WHERE id = ? RETURNING `+userTokenCols), ns(now), id))
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return store.ErrNotFound
		case err != nil || !t.RevokedAt.Equal(fromNS(ns(now))):
			return err // revoked before: nothing done, nothing audited
		}
		return s.writeAudit(ctx, tx, audited{a, wire.AuditUserTokenRevoke, id, now})
	})
	if err != nil {
		return store.UserToken{}, fmt.Errorf("revoke user token: %w", err)
	}
	return t, nil
}
