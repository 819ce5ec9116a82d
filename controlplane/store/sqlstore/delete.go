package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// DeleteConversation marks a conversation deleted on its owner's word (see
// store.Store). The conversation row is locked first, as EnqueueTurn
// updates it first: an enqueue that committed before is seen as a waiting
// turn, which refuses the call, and one after finds the conversation
// deleted. A claim or release only moves a turn between queued and
// running, both of which refuse.
func (s *Store) DeleteConversation(ctx context.Context, id string, now time.Time) (wire.Conversation, error) {
	err := s.write(ctx, func(tx txn) error {
		var state string
		err := tx.QueryRowContext(ctx, s.q(`SELECT state FROM conversations WHERE id = ?`+s.lockRow()), id).Scan(&state)
		if errors.Is(err, sql.ErrNoRows) {
			return store.ErrNotFound
		}
		if err != nil || state == wire.ConversationDeleted {
			return err
		}
		var pending int
		if err := tx.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM jobs WHERE conversation_id = ? AND state IN ('queued', 'running')`), id).Scan(&pending); err != nil {
			return err
		}
		if pending > 0 {
			return store.ErrConversationBusy
		}
		_, err = s.exec(ctx, tx, `UPDATE conversations SET state = 'deleted', interrupted_job_id = '', updated_at = ? WHERE id = ?`, ns(now), id)
		return err
	})
	if err != nil {
		return wire.Conversation{}, fmt.Errorf("delete conversation: %w", err)
	}
	return s.GetConversation(ctx, id)
}
