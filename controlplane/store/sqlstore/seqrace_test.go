package sqlstore_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore/sqltest"
	"github.com/runnerd/runnerd/controlplane/store/storetest"
	"github.com/runnerd/runnerd/wire"
)

// TestPostgresSameSeqUploadsRace: two uploads of the same (attempt, seq)
// on PostgreSQL, made to race deterministically: both statements start
// (each sees no such event yet) while another transaction holds the job's
// event counter, so both wait for it, and once it is let go the first
// stores the event and the second meets job_events_runner_seq. The
// second is a replay and is answered as one — 200, the same
// stored_through — as the transactional path answers a repeat; the event
// is stored once and the job's events stay numbered without a gap.
func TestPostgresSameSeqUploadsRace(t *testing.T) {
	ctx := context.Background()
	dsn := sqltest.PostgresSchema(t)
	st := sqltest.OpenPostgres(t, dsn)
	now, err := st.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h, err := st.CreateHost(ctx, "host-a", storetest.Hash("host-a"), store.Audit{Actor: "test"}, now)
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
	r := wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}
	events := []wire.Event{{Seq: 1, Time: now, Type: "agent.output", Data: []byte(`{"text":"hi"}`)},
		{Seq: 2, Time: now, Type: "agent.output", Data: []byte(`{"text":"there"}`)}}

	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	holder, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback()
	var pid int
	if err := holder.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.ExecContext(ctx, `SELECT last FROM job_event_counts WHERE job_id = $1 FOR UPDATE`, c.JobID); err != nil {
		t.Fatal(err)
	}
	type result struct {
		resp wire.EventsResponse
		err  error
	}
	results := make(chan result, 2)
	for range 2 {
		go func() {
			resp, err := st.AppendEventsAs(ctx, w, r, events, now.Add(time.Second))
			results <- result{resp, err}
		}()
	}
	// Both wait behind the holder, directly or behind each other.
	for {
		var waiting int
		if err := db.QueryRowContext(ctx, `WITH RECURSIVE b(pid) AS (SELECT CAST($1 AS INT)
			UNION SELECT a.pid FROM pg_stat_activity a, b WHERE b.pid = ANY(pg_blocking_pids(a.pid)))
			SELECT COUNT(*) - 1 FROM b`, pid).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting >= 2 {
			break
		}
	}
	if err := holder.Commit(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		res := <-results
		if res.err != nil || res.resp.StoredThrough != 2 {
			t.Errorf("an upload of seqs 1 and 2 = %+v, %v; want 200, stored_through 2", res.resp, res.err)
		}
	}
	all, err := st.JobEvents(ctx, c.JobID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var runner int
	for i, e := range all {
		if e.ID != int64(i+1) {
			t.Errorf("event %d is numbered %d: %+v", i+1, e.ID, all)
		}
		if e.Source == "runner" {
			runner++
		}
	}
	if runner != 2 {
		t.Errorf("%d runner events stored, want 2: %+v", runner, all)
	}
}
