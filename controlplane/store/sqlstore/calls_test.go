package sqlstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore/sqltest"
	"github.com/runnerd/runnerd/controlplane/store/storetest"
	"github.com/runnerd/runnerd/wire"
)

// TestRenewAsOnTheStoresClock: a renewal given no time is judged and
// extended on the store's clock read inside its statement (on PostgreSQL
// the database's, K3), and a test clock (WithClock) still moves it: the
// seam the K3 tests inject offsets through.
func TestRenewAsOnTheStoresClock(t *testing.T) {
	const skew = time.Hour
	for _, tc := range []struct {
		name string
		open func(t *testing.T, opts ...sqlstore.Option) *sqlstore.Store
	}{
		{"sqlite", func(t *testing.T, opts ...sqlstore.Option) *sqlstore.Store { return sqltest.SQLite(t, opts...) }},
		{"postgres", func(t *testing.T, opts ...sqlstore.Option) *sqlstore.Store { return sqltest.Postgres(t, opts...) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, offset := range []time.Duration{0, skew} {
				var opts []sqlstore.Option
				if offset != 0 {
					opts = append(opts, sqlstore.WithClock(func(b time.Time) time.Time { return b.Add(offset) }))
				}
				st := tc.open(t, opts...)
				ctx := context.Background()
				now, err := st.Now(ctx)
				if err != nil {
					t.Fatal(err)
				}
				h, err := st.CreateHost(ctx, "h", storetest.Hash("host"), store.Audit{Actor: "test"}, now)
				if err != nil {
					t.Fatal(err)
				}
				conv, err := st.CreateConversation(ctx, wire.CreateConversationRequest{AgentCommand: []string{"a"}}, now)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := st.EnqueueTurn(ctx, conv.ID, "p", now); err != nil {
					t.Fatal(err)
				}
				c, ok, err := st.Claim(ctx, store.ClaimParams{HostID: h.ID, LeaseTTL: time.Minute, WorkerTokenHash: storetest.Hash("w"), Now: now})
				if err != nil || !ok {
					t.Fatalf("Claim = %v, %v", ok, err)
				}
				w := store.Worker{JobID: c.JobID, TokenHash: storetest.Hash("w")}
				ref := wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}
				before, _ := st.Now(ctx)
				r, err := st.RenewAs(ctx, w, ref, 2*time.Minute, time.Time{})
				after, _ := st.Now(ctx)
				if err != nil {
					t.Fatalf("RenewAs: %v", err)
				}
				if exp := r.LeaseExpiresAt; exp.Before(before.Add(2*time.Minute)) || exp.After(after.Add(2*time.Minute)) {
					t.Fatalf("offset %v: lease to %v, want between %v and %v: the store's clock plus the TTL",
						offset, exp, before.Add(2*time.Minute), after.Add(2*time.Minute))
				}
				if offset != 0 && r.LeaseExpiresAt.Before(time.Now().Add(offset)) {
					t.Fatalf("lease to %v ignores the test clock's %v", r.LeaseExpiresAt, offset)
				}
			}
		})
	}
}
