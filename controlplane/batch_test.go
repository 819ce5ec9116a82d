package controlplane_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// Issue 14 §3 over HTTP, on both stores: a claim with max_claims takes up
// to that many turns in one answer, each its own attempt of its own
// conversation with its own worker token (each renews its own lease);
// a claim without max_claims (or 1) is answered in the one-claim shape an
// older daemon reads; a conversation's next turn waits for its running
// one; max_claims out of bounds is refused.
func TestClaimBatch(t *testing.T) {
	onEachDatabase(t, func(t *testing.T, db database) {
		f := newFixtureOn(t, db)
		ctx := context.Background()
		first := f.newConversation()
		want := []string{f.send(first.ID, "a1").ID}
		f.send(first.ID, "a2") // waits for a1
		for range 4 {
			want = append(want, f.send(f.newConversation().ID, "p").ID)
		}

		batch, err := f.wc.Claims(ctx, f.hostToken, wire.ClaimRequest{MaxClaims: 4})
		if err != nil || len(batch) != 4 {
			t.Fatalf("batch of 4: %d claims, %v", len(batch), err)
		}
		convs, tokens := map[string]bool{}, map[string]bool{}
		for i, c := range batch {
			if c.JobID != want[i] || c.LeaseGeneration != 1 || c.Replayed {
				t.Fatalf("claim %d = %+v, want job %s at generation 1 (queue order)", i, c, want[i])
			}
			if convs[c.Turn.ConversationID] || tokens[c.WorkerToken] || !strings.HasPrefix(c.WorkerToken, controlplane.WorkerTokenPrefix) {
				t.Fatalf("claim %d repeats a conversation or a token: %+v", i, batch)
			}
			convs[c.Turn.ConversationID], tokens[c.WorkerToken] = true, true
			if _, err := f.wc.Renew(ctx, c.WorkerToken, c.JobID, wire.RenewRequest{AttemptRef: ref(c)}); err != nil {
				t.Fatalf("claim %d renews with its own token: %v", i, err)
			}
			if _, err := f.wc.Renew(ctx, c.WorkerToken, batch[(i+1)%4].JobID, wire.RenewRequest{AttemptRef: ref(batch[(i+1)%4])}); err == nil {
				t.Fatalf("claim %d's token renewed another claim's lease", i)
			}
		}

		// The one-claim shape, for a request without max_claims: what an
		// older daemon reads.
		body := f.expect(http.MethodPost, wire.PathClaim, f.hostToken, `{"wait_ms":0}`, http.StatusOK, "")
		var one map[string]json.RawMessage
		if err := json.Unmarshal(body, &one); err != nil || one["job_id"] == nil || one["claims"] != nil {
			t.Fatalf("a claim without max_claims answered %s, want one claim's fields", body)
		}
		if _, err := f.wc.Claims(ctx, f.hostToken, wire.ClaimRequest{MaxClaims: 4}); !errors.Is(err, wire.ErrNoClaim) {
			t.Fatalf("batch with only a2 queued behind its running turn: %v, want 204", err)
		}
		for _, bad := range []string{`{"max_claims":-1}`, `{"max_claims":65}`} {
			f.expect(http.MethodPost, wire.PathClaim, f.hostToken, bad, http.StatusBadRequest, wire.CodeInvalid)
		}
	})
}

// Issue 14 §3 with issue 11 §11: a keyed batch whose answer is committed
// and then lost is asked again with the same key and gets the same
// attempts — jobs, generations, worker tokens (which renew), leases,
// holds — and no more, though another turn was queued meanwhile: nothing
// is orphaned for the reaper. No record holds the key or a token.
func TestClaimBatchAnswerDroppedAfterCommit(t *testing.T) {
	onEachDatabase(t, func(t *testing.T, db database) {
		f := newFixtureOn(t, db)
		ctx := context.Background()
		d := &dropFirstAnswer{next: f.srv.Handler()}
		hs := httptest.NewServer(d)
		t.Cleanup(hs.Close)
		wc := &wire.Client{BaseURL: hs.URL, HTTP: hs.Client()}
		j1, j2 := f.send(f.newConversation().ID, "one"), f.send(f.newConversation().ID, "two")
		req := wire.ClaimRequest{IdempotencyKey: "BATCHKEY0123456789ABCDEFGHIJ", MaxClaims: 3}
		if _, err := wc.Claims(ctx, f.hostToken, req); wire.Classify(err) != wire.Transient || err == nil {
			t.Fatalf("first batch: %v, want a transport error", err)
		}
		d.mu.Lock()
		body := d.body
		d.mu.Unlock()
		var lost wire.ClaimBatch
		if err := json.Unmarshal(body, &lost); err != nil || len(lost.Claims) != 2 {
			t.Fatalf("the lost answer %s: %v", body, err)
		}
		late := f.send(f.newConversation().ID, "late")
		got, err := wc.Claims(ctx, f.hostToken, req)
		if err != nil || len(got) != 2 {
			t.Fatalf("retried batch: %d claims, %v; want the lost 2", len(got), err)
		}
		for i, c := range got {
			l := lost.Claims[i]
			if !c.Replayed || c.AttemptID != l.AttemptID || c.JobID != l.JobID || c.LeaseGeneration != l.LeaseGeneration ||
				c.WorkerToken != l.WorkerToken || !c.LeaseExpiresAt.Equal(l.LeaseExpiresAt) || c.HeldMS != l.HeldMS {
				t.Fatalf("retried claim %d = %+v, want the lost %+v", i, c, l)
			}
			if _, err := wc.Renew(ctx, c.WorkerToken, c.JobID, wire.RenewRequest{AttemptRef: ref(c)}); err != nil {
				t.Fatalf("renew with replayed token %d: %v", i, err)
			}
		}
		if got[0].JobID != j1.ID || got[1].JobID != j2.ID {
			t.Fatalf("replayed jobs %s, %s; want %s, %s", got[0].JobID, got[1].JobID, j1.ID, j2.ID)
		}
		for _, id := range []string{j1.ID, j2.ID} {
			if j := f.job(id); len(j.Attempts) != 1 {
				t.Fatalf("job %s has %d attempts, want its one", id, len(j.Attempts))
			}
		}
		if j := f.job(late.ID); j.State != wire.JobQueued {
			t.Fatalf("the turn queued after the lost answer is %s; a replay claims nothing new", j.State)
		}
		logs := f.logs.String()
		if strings.Contains(logs, req.IdempotencyKey) || strings.Contains(logs, got[0].WorkerToken) || strings.Contains(logs, got[1].WorkerToken) {
			t.Fatal("a record holds the idempotency key or a worker token")
		}
	})
}

// The claim long poll wakes on the store's signal, not on a timer: a turn
// enqueued 7 s into a batch claim's wait is answered at that very instant
// (the slow re-check would have found it at 8 s), with the one turn there
// is — a batch does not wait to fill. A turn in its release backoff (K7),
// which no signal announces, is found by the re-check within
// DefaultClaimRecheck after the backoff ends.
func TestClaimLongPollWakesOnNewWork(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubble(t)
		ctx := context.Background()
		const after = 7 * time.Second
		go func() {
			time.Sleep(after)
			if _, err := b.tryEnqueue(); err != nil {
				t.Error(err)
			}
		}()
		start := time.Now()
		got, err := b.wc.Claims(ctx, b.hostToken, wire.ClaimRequest{WaitMS: 30_000, MaxClaims: 3})
		if err != nil || len(got) != 1 || time.Since(start) != after {
			t.Fatalf("batch claim: %d claims, %v after %v; want one turn at exactly %v", len(got), err, time.Since(start), after)
		}
		c := got[0]
		if err := b.wc.Release(ctx, c.WorkerToken, c.JobID, wire.ReleaseRequest{AttemptRef: ref(c), Class: "spawn_failed"}); err != nil {
			t.Fatal(err)
		}
		start = time.Now()
		got, err = b.wc.Claims(ctx, b.hostToken, wire.ClaimRequest{WaitMS: 30_000, MaxClaims: 3})
		took := time.Since(start)
		if err != nil || len(got) != 1 || got[0].JobID != c.JobID {
			t.Fatalf("claim after the release: %+v, %v", got, err)
		}
		backoff := 5 * time.Second // the store's default first release backoff
		if took < backoff || took > backoff+controlplane.DefaultClaimRecheck {
			t.Fatalf("the released turn was claimed %v after the release; want within the re-check (%v) after its %v backoff",
				took, controlplane.DefaultClaimRecheck, backoff)
		}
	})
}

// Several replicas on one PostgreSQL database. A host long
// polls replica B, whose re-check is an hour: only B's listener can wake
// it. The turn is sent through replica A; B answers the waiting claim with
// it, woken by the signal, never by the re-check.
func TestClaimWakesOnAnotherReplica(t *testing.T) {
	db := postgresDB(t)
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)
	stA, stB := db.open(t), db.open(t)
	a := httptest.NewServer(controlplane.New(controlplane.Config{Store: stA, Logger: quiet}).Handler())
	t.Cleanup(a.Close)
	reg := prometheus.NewRegistry()
	srvB := controlplane.New(controlplane.Config{Store: stB, Logger: quiet, Metrics: controlplane.NewMetrics(reg), ClaimRecheck: time.Hour})
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/", srvB.Handler())
	b := httptest.NewServer(mux)
	t.Cleanup(b.Close)

	now, err := stA.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hostToken := controlplane.NewToken(controlplane.HostTokenPrefix)
	if _, err := stA.CreateHost(ctx, "host-a", controlplane.HashToken(hostToken), store.Audit{Actor: "test"}, now); err != nil {
		t.Fatal(err)
	}
	if _, err := stA.CreateUserToken(ctx, "test", controlplane.HashToken(userToken), store.Audit{Actor: "test"}, now); err != nil {
		t.Fatal(err)
	}
	wa := &wire.Client{BaseURL: a.URL, HTTP: a.Client()}
	var conv wire.Conversation
	if _, err := wa.Do(ctx, http.MethodPost, "/v1/conversations", userToken, wire.CreateConversationRequest{Image: "i", AgentCommand: []string{"a"}}, &conv); err != nil {
		t.Fatal(err)
	}

	type answer struct {
		claims []wire.Claim
		err    error
	}
	done := make(chan answer, 1)
	go func() {
		wb := &wire.Client{BaseURL: b.URL, HTTP: b.Client()}
		cs, err := wb.Claims(ctx, hostToken, wire.ClaimRequest{WaitMS: 30_000, MaxClaims: 2})
		done <- answer{cs, err}
	}()
	// Once B's poll waits (it found nothing), send the turn through A.
	for deadline := time.Now().Add(20 * time.Second); scrapeText(t, b.URL+"/metrics")["controlplane_claim_polls_waiting"] != 1; {
		if time.Now().After(deadline) {
			t.Fatal("replica B's claim never began to wait")
		}
		time.Sleep(10 * time.Millisecond)
	}
	var j wire.Job
	if _, err := wa.Do(ctx, http.MethodPost, "/v1/conversations/"+conv.ID+"/messages", userToken, wire.SendMessageRequest{Prompt: "hello"}, &j); err != nil {
		t.Fatal(err)
	}
	got := <-done
	if got.err != nil || len(got.claims) != 1 || got.claims[0].JobID != j.ID {
		t.Fatalf("replica B's claim: %+v, %v; want the turn sent through A", got.claims, got.err)
	}
	m := scrapeText(t, b.URL+"/metrics")
	if m[`controlplane_claim_wakes_total{by="signal"}`] < 1 || m[`controlplane_claim_wakes_total{by="recheck"}`] != 0 {
		t.Fatalf("replica B's wakes: %v; want the signal's, no re-check", m)
	}
}
