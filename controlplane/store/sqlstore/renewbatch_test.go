package sqlstore_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore"
	"github.com/runnerd/runnerd/controlplane/store/storetest"
	"github.com/runnerd/runnerd/wire"
)

// TestPostgresRenewalsCoalesce: renewals that arrive while one statement
// runs are renewed by the next one, a single statement for all of them,
// each fenced on its own row and answered on its own: every live one gets
// its own TTL, while a stale generation among them is refused with its
// stale report and an unknown token as unauthorized.
func TestPostgresRenewalsCoalesce(t *testing.T) {
	sqlstore.PostgresTestDSN(t)
	ctx := context.Background()
	st := sqlstore.OpenTestPostgres(t)
	now, err := st.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h, err := st.CreateHost(ctx, "host-a", storetest.Hash("host-a"), store.Audit{Actor: "test"}, now)
	if err != nil {
		t.Fatal(err)
	}
	const n = 40
	claims := make([]wire.Claim, n)
	for i := range claims {
		conv, err := st.CreateConversation(ctx, wire.CreateConversationRequest{AgentCommand: []string{"a"}}, now)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.EnqueueTurn(ctx, conv.ID, "p", now); err != nil {
			t.Fatal(err)
		}
		c, ok, err := st.Claim(ctx, store.ClaimParams{HostID: h.ID, LeaseTTL: time.Minute,
			WorkerTokenHash: storetest.Hash(fmt.Sprint("w", i)), Now: now})
		if err != nil || !ok {
			t.Fatalf("Claim %d = %v, %v", i, ok, err)
		}
		claims[i] = c
	}
	const stale, stranger = 7, 23
	queued, release := sqlstore.HoldRenewals(st)
	before, renewedBefore := sqlstore.RenewStatements(st)
	answers := make([]wire.RenewResponse, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, c := range claims {
		w := store.Worker{JobID: c.JobID, TokenHash: storetest.Hash(fmt.Sprint("w", i))}
		ref := wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}
		switch i {
		case stale:
			ref.LeaseGeneration++
		case stranger:
			w.TokenHash = storetest.Hash("nobody")
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i], errs[i] = st.RenewAs(ctx, w, ref, time.Duration(i+10)*time.Second, time.Time{})
		}()
	}
	for queued() < n { // every renewal waits behind the held turn
		runtime.Gosched()
	}
	release()
	wg.Wait()
	after, renewed := sqlstore.RenewStatements(st)
	if after-before != 1 || renewed-renewedBefore != n-2 {
		t.Errorf("%d renewals queued together took %d coalesced statements renewing %d, want 1 renewing %d (all but the stale and the stranger)",
			n, after-before, renewed-renewedBefore, n-2)
	}
	for i := range claims {
		switch i {
		case stale:
			if !errors.Is(errs[i], store.ErrLeaseLost) {
				t.Errorf("the stale renewal: %v, want ErrLeaseLost", errs[i])
			}
		case stranger:
			if !errors.Is(errs[i], store.ErrUnauthorized) {
				t.Errorf("the unknown token's renewal: %v, want ErrUnauthorized", errs[i])
			}
		default:
			ttl := time.Duration(i+10) * time.Second
			if errs[i] != nil || answers[i].LeaseTTLMS != ttl.Milliseconds() || answers[i].LeaseExpiresAt.Before(now.Add(ttl)) {
				t.Errorf("renewal %d = %+v, %v; want its own TTL %v from after %v", i, answers[i], errs[i], ttl, now)
			}
		}
	}
	j, err := st.GetJob(ctx, claims[stale].JobID)
	if err != nil {
		t.Fatal(err)
	}
	var reports int
	for _, e := range j.Events {
		if e.Type == "lease.stale_report" {
			reports++
		}
	}
	if reports != 1 {
		t.Errorf("the stale renewal left %d stale reports, want 1", reports)
	}
}
