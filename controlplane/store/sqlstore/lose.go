package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// LoseConversation marks a conversation LOST on an operator's word (see
// store.Store). Its queued turns are first taken off the claim indexes
// (head = 0): a claim that picked one meanwhile finds it failed once this
// commits, and one that committed first shows up as a running turn, which
// refuses the call. A LOST or deleted conversation is returned as it is.
func (s *Store) LoseConversation(ctx context.Context, id string, a store.Audit, now time.Time) (wire.Conversation, error) {
	if strings.TrimSpace(a.Reason) == "" {
		return wire.Conversation{}, fmt.Errorf("lose conversation: %w: a reason is required", store.ErrInvalid)
	}
	err := s.write(ctx, func(tx txn) error {
		var state string
		err := tx.QueryRowContext(ctx, s.q(`SELECT state FROM conversations WHERE id = ?`+s.lockRow()), id).Scan(&state)
		if errors.Is(err, sql.ErrNoRows) {
			return store.ErrNotFound
		}
		if err != nil || state == wire.ConversationLost || state == wire.ConversationDeleted {
			return err
		}
		if _, err := s.exec(ctx, tx, `UPDATE jobs SET head = 0 WHERE conversation_id = ? AND state = 'queued'`, id); err != nil {
			return err
		}
		var running int
		if err := tx.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM jobs WHERE conversation_id = ? AND state = 'running'`), id).Scan(&running); err != nil {
			return err
		}
		if running > 0 {
			return fmt.Errorf("%w: a turn of this conversation is running; its lease decides first", store.ErrInvalid)
		}
		if err := s.loseConversation(ctx, tx, id, reasonLostHostRetired, now); err != nil {
			return err
		}
		return s.writeAudit(ctx, tx, audited{a, wire.AuditConversationLose, id, now})
	})
	if err != nil {
		return wire.Conversation{}, fmt.Errorf("lose conversation: %w", err)
	}
	return s.GetConversation(ctx, id)
}
