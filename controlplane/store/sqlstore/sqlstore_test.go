package sqlstore_test

import (
	"context"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore"
	"github.com/runnerd/runnerd/controlplane/store/storetest"
	"github.com/runnerd/runnerd/wire"
)

func TestSQLiteConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return sqlstore.OpenTestSQLite(t) })
}

func TestPostgresConformance(t *testing.T) {
	sqlstore.PostgresTestDSN(t)
	storetest.Run(t, func(t *testing.T) store.Store { return sqlstore.OpenTestPostgres(t) })
}

// The receipts tests run the real store inside a testing/synctest bubble:
// opened and closed inside it, the store must not leave a goroutine behind
// nor block fake time.
func TestSQLiteInSynctestBubble(t *testing.T) {
	dir := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		st, err := sqlstore.OpenSQLite(ctx, filepath.Join(dir, "cp.db"))
		if err != nil {
			t.Fatalf("OpenSQLite: %v", err)
		}
		defer st.Close()
		now := time.Now()
		h, err := st.CreateHost(ctx, "h", storetest.Hash("h"), store.Audit{Actor: "test"}, now)
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
		time.Sleep(time.Minute)
		c, ok, err := st.Claim(ctx, store.ClaimParams{HostID: h.ID, WorkerTokenHash: storetest.Hash("w"), Now: time.Now()})
		if err != nil || !ok {
			t.Fatalf("Claim = %v, %v", ok, err)
		}
		if want := now.Add(time.Minute + sqlstore.DefaultLeaseTTL); !c.LeaseExpiresAt.Equal(want) {
			t.Fatalf("lease expires at %v, want %v", c.LeaseExpiresAt, want)
		}
	})
}
