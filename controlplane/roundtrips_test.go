package controlplane_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore/sqltest"
	"github.com/runnerd/runnerd/wire"
)

// roundTrips serves a PostgreSQL store, with no test clock (so the
// store reads the database's), through connections that count their
// round trips, runs whole turns through the worker API and returns, per
// call, the round trips each of the last turns' calls took (the first
// turns warm the pool's statement caches).
func roundTrips(t *testing.T, turns, warm int) map[string][]int64 {
	t.Helper()
	ctx := context.Background()
	dsn, trips := sqltest.RoundTrips(t, sqltest.PostgresSchema(t))
	st := sqltest.OpenPostgres(t, dsn)
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
	out := map[string][]int64{}
	count := func(turn int, call string, fn func() error) {
		t.Helper()
		before := trips.Load()
		if err := fn(); err != nil {
			t.Fatalf("turn %d, %s: %v", turn, call, err)
		}
		if turn >= warm {
			out[call] = append(out[call], trips.Load()-before)
		}
	}
	for i := range turns {
		conv, err := st.CreateConversation(ctx, wire.CreateConversationRequest{AgentCommand: []string{"agent"}}, now)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.EnqueueTurn(ctx, conv.ID, fmt.Sprintf("turn %d", i), now); err != nil {
			t.Fatal(err)
		}
		var c wire.Claim
		// Keyed, as the daemon's claims are.
		key := wire.ClaimRequest{IdempotencyKey: fmt.Sprintf("TRIPS%025d", i)}
		count(i, "claim", func() (err error) { c, err = wc.Claim(ctx, hostToken, key); return err })
		ref := wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}
		tok, job := c.WorkerToken, c.JobID
		for range 2 {
			count(i, "renew", func() error { _, err := wc.Renew(ctx, tok, job, wire.RenewRequest{AttemptRef: ref}); return err })
		}
		count(i, "events", func() error {
			_, err := wc.Events(ctx, tok, job, wire.EventsRequest{AttemptRef: ref, Events: []wire.Event{{Seq: 1, Type: "progress"}}})
			return err
		})
		act := "act-" + c.AttemptID
		count(i, "admission", func() error {
			_, err := wc.Admission(ctx, tok, job, wire.AdmissionRequest{AttemptRef: ref, ActivationID: act})
			return err
		})
		count(i, "settlement", func() error {
			_, err := wc.Settlement(ctx, tok, job, wire.SettlementRequest{AttemptRef: ref, ActivationID: act,
				Supervisor: wire.SupervisorReceipt{ActivationID: act, ReceiptID: "rcpt-" + c.AttemptID, NativeTurn: 1}})
			return err
		})
		count(i, "finish", func() error {
			_, err := wc.Finish(ctx, tok, job, wire.FinishRequest{AttemptRef: ref, Outcome: wire.OutcomeSucceeded})
			return err
		})
	}
	return out
}

func median(xs []int64) int64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestWorkerCallsRoundTrips: on PostgreSQL each worker call over HTTP is
// one statement, the worker token's hash, the attempt, its generation,
// the lease and the database's clock together, no BEGIN or COMMIT, no
// separate token lookup: renew, events, admission and settlement one
// round trip; a claim two (the store's clock, then one statement that
// checks the host and takes the turn); a succeeded finish two (the
// clock, then two statements pipelined as one transaction). The host
// token is cached (HostTokenCache). It logs every count
// (docs/performance.md).
func TestWorkerCallsRoundTrips(t *testing.T) {
	got := roundTrips(t, 12, 4)
	want := map[string]int64{"claim": 2, "renew": 1, "events": 1, "admission": 1, "settlement": 1, "finish": 2}
	for _, call := range []string{"claim", "renew", "events", "admission", "settlement", "finish"} {
		m := median(got[call])
		t.Logf("%-10s round trips: median %d, all %v", call, m, got[call])
		if m > want[call] {
			t.Errorf("%s takes %d round trips to PostgreSQL (all: %v), want at most %d", call, m, got[call], want[call])
		}
	}
}

// TestConversationStatesIsOneQuery: a host's question about 1,000
// conversations costs PostgreSQL the same round trips as one about a
// single conversation: the host token, the cluster identity and one
// query for all the states.
func TestConversationStatesIsOneQuery(t *testing.T) {
	ctx := context.Background()
	dsn, trips := sqltest.RoundTrips(t, sqltest.PostgresSchema(t))
	st := sqltest.OpenPostgres(t, dsn)
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
	ids := make([]string, wire.MaxConversationIDs)
	for i := range ids {
		ids[i] = fmt.Sprintf("conv_unknown_%04d", i)
	}
	for i := range 20 {
		c, err := st.CreateConversation(ctx, wire.CreateConversationRequest{AgentCommand: []string{"agent"}}, now)
		if err != nil {
			t.Fatal(err)
		}
		ids[i*50] = c.ID
	}
	ask := func(ids []string) int64 {
		t.Helper()
		var n int64
		for range 3 { // the last, with the statements prepared
			before := trips.Load()
			got, err := wc.ConversationStates(ctx, hostToken, wire.ConversationStatesRequest{ConversationIDs: ids})
			if err != nil || len(got.Conversations) != len(ids) || got.Conversations[0].State != wire.ConversationUsable {
				t.Fatalf("ConversationStates of %d ids = %d answers (first %+v), %v", len(ids), len(got.Conversations), got.Conversations[:1], err)
			}
			n = trips.Load() - before
		}
		return n
	}
	one, all := ask(ids[:1]), ask(ids)
	t.Logf("round trips: 1 id %d, %d ids %d", one, len(ids), all)
	// At most 3 either way: the host token (cached for a couple of
	// seconds, so looked up again or not depending on the machine's
	// speed), the cluster identity, and the states in one query whatever
	// their number.
	if all > 3 || one > 3 {
		t.Fatalf("%d ids took %d round trips and 1 id %d; want at most 3 each (host token, cluster identity, states)", len(ids), all, one)
	}
}
