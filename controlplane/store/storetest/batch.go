package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// claimBatch claims up to n turns at now on h in one call, each attempt
// with a token of its own; it fails the test on an error.
func (f *fixture) claimBatch(h store.Host, n int, key string, now time.Time) []wire.Claim {
	f.t.Helper()
	slots := make([]store.ClaimSlot, n)
	tokens := make([]string, n)
	for i := range slots {
		f.n++
		tokens[i] = fmt.Sprintf("batch-%s-%d", h.ID, f.n)
		if key != "" {
			slots[i].AttemptID = fmt.Sprintf("att_batch%d", f.n)
			tokens[i] = key + slots[i].AttemptID // stands for the token the server derives
		}
		slots[i].WorkerTokenHash = Hash(tokens[i])
	}
	p := store.ClaimParams{HostID: h.ID, LeaseTTL: TTL, Now: now,
		AttemptID: slots[0].AttemptID, WorkerTokenHash: slots[0].WorkerTokenHash, More: slots[1:]}
	if key != "" {
		p.KeyHash = Hash(key)
	}
	cs, err := f.st.ClaimMany(f.ctx, p)
	if err != nil {
		f.t.Fatalf("Claim of %d: %v", n, err)
	}
	if len(cs) > n {
		f.t.Fatalf("Claim of %d gave %d turns", n, len(cs))
	}
	for i, c := range cs {
		if !c.Replayed {
			f.tokens[c.AttemptID] = tokens[i] // a new claim is its slot's
		}
	}
	return cs
}

// jobsOf lists the claims' job ids in their order.
func jobsOf(cs []wire.Claim) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.JobID)
	}
	return out
}

// One claim takes up to its limit of turns, oldest first,
// each its own running attempt with its own worker token, lease and
// generation — and never two turns of one conversation: the second turn
// of a conversation waits for the first as it would for single claims. A
// batch larger than the queue takes what is runnable; an empty queue
// gives none.
func testBatchClaimLimitDistinct(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	a, b, c, d := f.conversation(), f.conversation(), f.conversation(), f.conversation()
	a1 := f.enqueue(a.ID, "a1")
	a2 := f.enqueue(a.ID, "a2")
	b1 := f.enqueue(b.ID, "b1")
	b2 := f.enqueue(b.ID, "b2")
	c1 := f.enqueue(c.ID, "c1")
	d1 := f.enqueue(d.ID, "d1")

	got := f.claimBatch(f.host, 3, "", T0)
	if want := []string{a1.ID, b1.ID, c1.ID}; fmt.Sprint(jobsOf(got)) != fmt.Sprint(want) {
		t.Fatalf("batch of 3 took %v, want the 3 oldest heads %v", jobsOf(got), want)
	}
	attempts, convs := map[string]bool{}, map[string]bool{}
	for _, cl := range got {
		if attempts[cl.AttemptID] || convs[cl.Turn.ConversationID] {
			t.Fatalf("batch repeats an attempt or a conversation: %+v", got)
		}
		attempts[cl.AttemptID], convs[cl.Turn.ConversationID] = true, true
		if cl.LeaseGeneration != 1 || !cl.LeaseExpiresAt.Equal(T0.Add(TTL)) || cl.Replayed {
			t.Fatalf("claim %+v: want generation 1, a lease to T0+TTL, not replayed", cl)
		}
		auth, err := st.AuthorizeAttempt(f.ctx, cl.JobID, Hash(f.tokens[cl.AttemptID]))
		if err != nil || auth.AttemptID != cl.AttemptID {
			t.Fatalf("the token of %s authorizes %+v, %v", cl.AttemptID, auth, err)
		}
		if j := f.job(cl.JobID); j.State != wire.JobRunning || len(j.Attempts) != 1 || j.Attempts[0].ID != cl.AttemptID {
			t.Fatalf("job %s after the batch: %+v", cl.JobID, j)
		}
	}
	// a2 and b2 wait behind their running heads: only d1 is runnable.
	if got := f.claimBatch(f.host, 10, "", T0); fmt.Sprint(jobsOf(got)) != fmt.Sprint([]string{d1.ID}) {
		t.Fatalf("batch of 10 took %v, want only %s (a2 and b2 wait for their conversations)", jobsOf(got), d1.ID)
	}
	if got := f.claimBatch(f.host, 4, "", T0); len(got) != 0 {
		t.Fatalf("batch with nothing runnable took %v", jobsOf(got))
	}
	// Ending a1 and b1 makes a2 and b2 the heads: one batch takes both.
	for _, cl := range got[:2] {
		if _, err := st.Finish(f.ctx, ref(cl), wire.FinishRequest{AttemptRef: ref(cl), Outcome: wire.OutcomeFailed, Class: "x"}, T0); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.claimBatch(f.host, 4, "", T0); fmt.Sprint(jobsOf(got)) != fmt.Sprint([]string{a2.ID, b2.ID}) {
		t.Fatalf("batch after the heads ended took %v, want [%s %s]", jobsOf(got), a2.ID, b2.ID)
	}
}

// Every claim of a batch keeps the rules a claim of one
// keeps — a job in its release backoff is passed (K7), a job whose route
// the host does not meet is not given (routing), a job whose sandbox is
// on another host is not given (affinity) — and a paused host is given
// nothing at all, until it is resumed.
func testBatchClaimKeepsRules(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	other := f.newHost("host-b")
	f.beat(f.host, wire.Labels{"sandbox": "process"}, T0)
	f.beat(other, wire.Labels{"sandbox": "process"}, T0)

	released := f.enqueue(f.conversation().ID, "released")
	pinnedConv := f.conversation()
	pinned := f.enqueue(pinnedConv.ID, "pinned")
	docker := f.enqueue(f.routed(wire.CreateConversationRequest{Sandbox: wire.SandboxDocker}).ID, "docker")
	free1 := f.enqueue(f.conversation().ID, "free1")
	free2 := f.enqueue(f.conversation().ID, "free2")

	// released goes into its backoff; pinned gets its sandbox on host-b.
	if c := f.claim(T0); c.JobID != released.ID {
		t.Fatalf("first claim %s, want %s", c.JobID, released.ID)
	} else {
		f.release(c, "declined:preflight_failed", T0)
	}
	cb, ok := f.tryClaim(other, T0)
	if !ok || cb.JobID != pinned.ID {
		t.Fatalf("host-b claimed %+v, %v; want %s", cb, ok, pinned.ID)
	}
	if err := st.RecordContainer(f.ctx, ref(cb), wire.ContainerRequest{AttemptRef: ref(cb), Backend: "process", ContainerID: "ws-b"}, T0); err != nil {
		t.Fatal(err)
	}
	f.release(cb, "declined:preflight_failed", T0) // queued again, pinned to host-b, in its backoff too

	if err := st.PauseHost(f.ctx, f.host.Name, true, Operator, T0); err != nil {
		t.Fatal(err)
	}
	if got := f.claimBatch(f.host, 5, "", T0); len(got) != 0 {
		t.Fatalf("a paused host's batch took %v", jobsOf(got))
	}
	if err := st.PauseHost(f.ctx, f.host.Name, false, Operator, T0); err != nil {
		t.Fatal(err)
	}
	got := f.claimBatch(f.host, 5, "", T0.Add(time.Millisecond))
	if want := []string{free1.ID, free2.ID}; fmt.Sprint(jobsOf(got)) != fmt.Sprint(want) {
		t.Fatalf("batch of 5 took %v, want %v (not the released job in its backoff, not the docker turn, not host-b's)", jobsOf(got), want)
	}
	// Past the backoff the released job is this host's again; the pinned
	// one stays host-b's and the docker turn waits for a docker host.
	after := T0.Add(store.DefaultReleaseBackoff)
	if got := f.claimBatch(f.host, 5, "", after); fmt.Sprint(jobsOf(got)) != fmt.Sprint([]string{released.ID}) {
		t.Fatalf("batch past the backoff took %v, want [%s]", jobsOf(got), released.ID)
	}
	if got := f.claimBatch(other, 5, "", after); fmt.Sprint(jobsOf(got)) != fmt.Sprint([]string{pinned.ID}) {
		t.Fatalf("host-b's batch took %v, want [%s]", jobsOf(got), pinned.ID)
	}
	if j := f.job(docker.ID); j.State != wire.JobQueued {
		t.Fatalf("the docker turn = %s, want still queued", j.State)
	}
}

// Issue 14 §3 with issue 11 §11: a keyed batch whose answer was lost is
// asked again with the same key and gets the same attempts back —
// replayed, same jobs, generations and leases — and no other, though
// more turns were queued meanwhile; the jobs keep one attempt each.
// Another host with the same key makes its own claim. Once the batch's
// attempts end, the same key claims anew.
func testBatchClaimKeyReplays(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	for range 2 {
		f.enqueue(f.conversation().ID, "p")
	}
	first := f.claimBatch(f.host, 3, "batch-key", T0)
	if len(first) != 2 {
		t.Fatalf("keyed batch of 3 took %v, want the 2 queued", jobsOf(first))
	}
	late := f.enqueue(f.conversation().ID, "late")
	again := f.claimBatch(f.host, 3, "batch-key", T0.Add(time.Second))
	if len(again) != len(first) {
		t.Fatalf("the retried batch = %v, want the first one's %v", jobsOf(again), jobsOf(first))
	}
	for i := range first {
		a, b := first[i], again[i]
		if !b.Replayed || b.AttemptID != a.AttemptID || b.JobID != a.JobID || b.LeaseGeneration != a.LeaseGeneration ||
			!b.LeaseExpiresAt.Equal(a.LeaseExpiresAt) {
			t.Fatalf("retried claim %d = %+v, want the first answer's %+v", i, b, a)
		}
		if j := f.job(a.JobID); len(j.Attempts) != 1 {
			t.Fatalf("job %s has %d attempts after the retry", a.JobID, len(j.Attempts))
		}
	}
	if j := f.job(late.ID); j.State != wire.JobQueued {
		t.Fatalf("the turn queued after the first batch = %s; a replay must not claim it", j.State)
	}
	other := f.newHost("host-b")
	if got := f.claimBatch(other, 3, "batch-key", T0.Add(time.Second)); len(got) != 1 || got[0].JobID != late.ID || got[0].Replayed {
		t.Fatalf("another host with the same key took %+v, want its own claim of %s", got, late.ID)
	}
	for _, c := range first {
		if _, err := st.Finish(f.ctx, ref(c), wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeFailed, Class: "x"}, T0.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	next := f.enqueue(f.conversation().ID, "next")
	if got := f.claimBatch(f.host, 3, "batch-key", T0.Add(2*time.Second)); len(got) != 1 || got[0].JobID != next.ID || got[0].Replayed {
		t.Fatalf("the key after its attempts ended took %+v, want a new claim of %s", got, next.ID)
	}
}

// signaled waits for ch to close: the store's signal travels through the
// database on PostgreSQL, so it may take a moment.
func signaled(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("no work signal within 30s after %s", what)
	}
}

// The store signals its waiting claims whenever a job may
// have become claimable — a turn enqueued, a turn released, the next turn
// of a conversation made its head by the end of the one before, a host
// resumed, a host's labels changed — so that a long poll need not poll.
func testWorkSignal(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	ch := st.WorkSignal()
	conv := f.conversation()
	f.enqueue(conv.ID, "first")
	signaled(t, "an enqueue", ch)

	ch = st.WorkSignal()
	f.enqueue(conv.ID, "second") // waits behind first
	c := f.claim(T0)
	f.release(c, "spawn_failed", T0)
	signaled(t, "a release", ch)

	c = f.claim(T0.Add(time.Minute))
	ch = st.WorkSignal()
	if _, err := st.Finish(f.ctx, ref(c), wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeFailed, Class: "x"}, T0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	signaled(t, "the end of the turn before", ch)

	if err := st.PauseHost(f.ctx, f.host.Name, true, Operator, T0); err != nil {
		t.Fatal(err)
	}
	ch = st.WorkSignal()
	if err := st.PauseHost(f.ctx, f.host.Name, false, Operator, T0); err != nil {
		t.Fatal(err)
	}
	signaled(t, "a host resumed", ch)

	ch = st.WorkSignal()
	f.beat(f.host, wire.Labels{"gpu": "a100"}, T0)
	signaled(t, "a host's labels changed", ch)
}
