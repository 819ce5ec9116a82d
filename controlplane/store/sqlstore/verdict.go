package sqlstore

import (
	"context"
	"fmt"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// item is one worker call of an operation's batch: the worker's token and
// job, and the attempt and lease generation its report names.
type item struct {
	w    store.Worker
	hash string // w.TokenHash as the store keeps it (hex)
	ref  wire.AttemptRef
}

// row is what an operation's statement returned for one item: nothing
// (found false) when the item's token is not its attempt's and job's, the
// attempt as the statement saw it otherwise, and whether the statement
// applied the call (changed).
type row struct {
	found      bool
	changed    bool
	jobID      string
	generation int64
	state      string
	now        int64 // the time the item was judged at, Unix nanoseconds
}

// refusal is a fenced call the statement did not apply.
type refusal struct {
	// token: the worker's token is not the attempt's; tokenRefusal words
	// which of AuthorizeAttempt's answers, or ErrOtherAttempt, it is.
	token bool
	// why the fence held the call out, recorded as a lease.stale_report
	// event (P1) and answered ErrLeaseLost: generation_mismatch,
	// attempt_<state> or lease_expired.
	why string
}

// verdict words a fenced call from its row, the same for every operation
// and both dialects (docs/protocol.md): nil when the call was applied.
func verdict(op string, it item, r row) *refusal {
	switch {
	case !r.found:
		return &refusal{token: true}
	case r.changed:
		return nil
	case r.generation != it.ref.LeaseGeneration:
		return &refusal{why: "generation_mismatch"}
	case r.state != wire.AttemptRunning:
		return &refusal{why: "attempt_" + r.state}
	default:
		return &refusal{why: "lease_expired"}
	}
}

// refuse answers a refusal: the token's, read from the store's record of
// the token, or ErrLeaseLost once the stale report is recorded.
func (s *Store) refuse(ctx context.Context, op string, it item, r row, why *refusal) error {
	if why.token {
		auth, err := s.AuthorizeAttempt(ctx, it.w.JobID, it.w.TokenHash)
		switch {
		case err != nil:
			return err
		case auth.AttemptID != it.ref.AttemptID:
			return store.ErrOtherAttempt
		default: // the token is this attempt's, yet the statement had no row of it
			return fmt.Errorf("%w: attempt %s", store.ErrNotFound, it.ref.AttemptID)
		}
	}
	return s.write(ctx, func(tx txn) error {
		return s.staleReport(ctx, tx, op, it.ref, r.jobID, why.why, fromNS(r.now))
	})
}
