package controlplane_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore/sqltest"
	"github.com/runnerd/runnerd/wire"
)

// TestPostgresKeyedClaimRacesItsRetry: a keyed claim and its retry (the
// same key, sent before the first is answered) race on PostgreSQL, many
// times, with one turn queued and with two: both are answered 200 with
// the same attempt and worker token, the claim and its replay — never a
// 500, never a second attempt, never "no work" for the retry.
func TestPostgresKeyedClaimRacesItsRetry(t *testing.T) {
	ctx := context.Background()
	st := sqltest.Postgres(t)
	srv := controlplane.New(controlplane.Config{Store: st, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	wc := &wire.Client{BaseURL: hs.URL, HTTP: hs.Client()}
	hostToken := controlplane.NewToken(controlplane.HostTokenPrefix)
	now, err := st.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateHost(ctx, "host-a", controlplane.HashToken(hostToken), store.Audit{Actor: "test"}, now); err != nil {
		t.Fatal(err)
	}
	const rounds = 100
	for i := range rounds {
		queued := 1 + i%2
		for range queued {
			conv, err := st.CreateConversation(ctx, wire.CreateConversationRequest{AgentCommand: []string{"agent"}}, now)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := st.EnqueueTurn(ctx, conv.ID, "p", now); err != nil {
				t.Fatal(err)
			}
		}
		req := wire.ClaimRequest{IdempotencyKey: fmt.Sprintf("RACE%026d", i)}
		var claims [2]wire.Claim
		var errs [2]error
		start := make(chan struct{})
		var wg sync.WaitGroup
		for k := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				claims[k], errs[k] = wc.Claim(ctx, hostToken, req)
			}()
		}
		close(start)
		wg.Wait()
		if errs[0] != nil || errs[1] != nil {
			t.Fatalf("round %d (%d queued): the claim and its retry answered %v and %v, want both the claim", i, queued, errs[0], errs[1])
		}
		if claims[0].AttemptID != claims[1].AttemptID || claims[0].WorkerToken != claims[1].WorkerToken || claims[0].Replayed == claims[1].Replayed {
			t.Fatalf("round %d (%d queued): attempts %s (replayed %v) and %s (replayed %v), want one claim and its replay",
				i, queued, claims[0].AttemptID, claims[0].Replayed, claims[1].AttemptID, claims[1].Replayed)
		}
		// End the turns taken, so that each round starts from an empty queue.
		done := []wire.Claim{claims[0]}
		if queued == 2 {
			c, err := wc.Claim(ctx, hostToken, wire.ClaimRequest{})
			if err != nil {
				t.Fatalf("round %d: the other turn: %v", i, err)
			}
			done = append(done, c)
		}
		for _, c := range done {
			ref := wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}
			if _, err := wc.Finish(ctx, c.WorkerToken, c.JobID, wire.FinishRequest{AttemptRef: ref, Outcome: wire.OutcomeFailed}); err != nil {
				t.Fatalf("round %d: finish: %v", i, err)
			}
		}
	}
}
