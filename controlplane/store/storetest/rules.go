package storetest

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

func testHosts(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	_, err := st.CreateHost(f.ctx, "host-a", Hash("other"), Operator, T0)
	wantErr(t, "CreateHost with a taken name", err, store.ErrExists)
	h, err := st.HostByTokenHash(f.ctx, Hash("host-token-host-a"))
	if err != nil || h != f.host {
		t.Fatalf("HostByTokenHash = %+v, %v; want %+v", h, err, f.host)
	}
	_, err = st.HostByTokenHash(f.ctx, Hash("nobody"))
	wantErr(t, "HostByTokenHash(unknown)", err, store.ErrUnauthorized)
	b := f.newHost("host-b")
	since := at(-time.Minute)
	if err := st.RecordHostHeartbeat(f.ctx, f.host.ID, wire.HostHeartbeat{Capacity: 4, Running: 9, Draining: true,
		LaunchError: &wire.LaunchError{Class: "spawn_failed", Consecutive: 3, Since: since}, Version: "v1"}, at(time.Second)); err != nil {
		t.Fatalf("RecordHostHeartbeat: %v", err)
	}
	wantErr(t, "RecordHostHeartbeat(unknown host)", st.RecordHostHeartbeat(f.ctx, "host_nope", wire.HostHeartbeat{}, T0), store.ErrNotFound)
	conv := f.conversation()
	f.enqueue(conv.ID, "p")
	f.claim(T0)
	servers, err := st.ListServers(f.ctx)
	if err != nil || len(servers) != 2 {
		t.Fatalf("ListServers = %+v, %v", servers, err)
	}
	a := servers[0]
	if a.Name != "host-a" || a.Capacity != 4 || !a.Draining || a.Version != "v1" || a.Running != 1 ||
		a.LastHeartbeat == nil || !a.LastHeartbeat.Equal(at(time.Second)) ||
		a.LaunchError == nil || a.LaunchError.Class != "spawn_failed" || a.LaunchError.Consecutive != 3 || !a.LaunchError.Since.Equal(since) {
		t.Fatalf("server a = %+v (launch error %+v)", a, a.LaunchError)
	}
	if servers[1].Name != b.Name || servers[1].LastHeartbeat != nil || servers[1].LaunchError != nil || servers[1].Running != 0 {
		t.Fatalf("server b = %+v", servers[1])
	}
}

func testAuthorizeAttempt(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	conv1, conv2 := f.conversation(), f.conversation()
	j1, j2 := f.enqueue(conv1.ID, "one"), f.enqueue(conv2.ID, "two")
	c1 := f.claim(T0)
	f.claim(T0)
	if c1.JobID != j1.ID {
		t.Fatalf("first claim took %s, want the oldest job %s", c1.JobID, j1.ID)
	}
	_, err := st.AuthorizeAttempt(f.ctx, j1.ID, Hash("no such token"))
	wantErr(t, "unknown token", err, store.ErrUnauthorized)
	_, err = st.AuthorizeAttempt(f.ctx, j2.ID, Hash(tokenOf(f, c1)))
	wantErr(t, "another job's token", err, store.ErrForbidden)
	_, err = st.AuthorizeAttempt(f.ctx, "job_nope", Hash(tokenOf(f, c1)))
	wantErr(t, "unknown job", err, store.ErrNotFound)
	_, err = st.AuthorizeAttempt(f.ctx, j1.ID, Hash("host-token-host-a"))
	wantErr(t, "a host token", err, store.ErrUnauthorized)
}

func testInvalidInput(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	_, err := st.CreateConversation(f.ctx, wire.CreateConversationRequest{Image: "x"}, T0)
	wantErr(t, "conversation without agent command", err, store.ErrInvalid)
	conv := f.conversation()
	_, err = st.EnqueueTurn(f.ctx, conv.ID, "  ", T0)
	wantErr(t, "empty prompt", err, store.ErrInvalid)
	_, err = st.EnqueueTurn(f.ctx, "conv_nope", "p", T0)
	wantErr(t, "unknown conversation", err, store.ErrNotFound)
	_, err = st.GetJob(f.ctx, "job_nope")
	wantErr(t, "GetJob(unknown)", err, store.ErrNotFound)
	_, err = st.GetConversation(f.ctx, "conv_nope")
	wantErr(t, "GetConversation(unknown)", err, store.ErrNotFound)
	f.enqueue(conv.ID, "p")
	_, _, err = st.Claim(f.ctx, store.ClaimParams{HostID: "host_nope", LeaseTTL: TTL, WorkerTokenHash: Hash("w"), Now: T0})
	wantErr(t, "claim by an unknown host", err, store.ErrNotFound)
	_, _, err = st.Claim(f.ctx, store.ClaimParams{HostID: f.host.ID, LeaseTTL: TTL, Now: T0})
	wantErr(t, "claim without a token hash", err, store.ErrInvalid)
	c := f.claim(T0) // the refused claims left the job queued
	if c.LeaseGeneration != 1 {
		t.Fatalf("generation after refused claims = %d, want 1", c.LeaseGeneration)
	}
	_, err = st.Finish(f.ctx, ref(c), wire.FinishRequest{AttemptRef: ref(c), Outcome: "great"}, T0)
	wantErr(t, "unknown outcome", err, store.ErrInvalid)
	_, err = st.AppendEvents(f.ctx, ref(c), []wire.Event{{Seq: 0, Type: "x"}}, T0)
	wantErr(t, "event seq 0", err, store.ErrInvalid)
	_, err = st.AppendEvents(f.ctx, ref(c), []wire.Event{{Seq: 1, Type: "x", Data: []byte("{nope")}}, T0)
	wantErr(t, "event with bad JSON", err, store.ErrInvalid)
	wantErr(t, "container without id", st.RecordContainer(f.ctx, ref(c), wire.ContainerRequest{Backend: "docker"}, T0), store.ErrInvalid)
	_, err = st.Admit(f.ctx, ref(c), "", T0)
	wantErr(t, "admission without activation", err, store.ErrInvalid)
	wantErr(t, "unknown notice kind", st.Notice(f.ctx, ref(c), wire.NoticeRequest{Kind: "x"}, T0), store.ErrInvalid)
	f.admit(c, T0)
	_, err = st.Finish(f.ctx, ref(c), wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeSucceeded}, T0)
	wantErr(t, "succeeded without settlement", err, store.ErrInvalid)
	_, err = st.Renew(f.ctx, wire.AttemptRef{AttemptID: "att_nope", LeaseGeneration: 1}, TTL, T0)
	wantErr(t, "renew of an unknown attempt", err, store.ErrNotFound)
	// None of the refusals above changed the attempt.
	if _, err := st.Renew(f.ctx, ref(c), TTL, at(time.Second)); err != nil {
		t.Fatalf("Renew after refused inputs: %v", err)
	}
}

// Turns of one conversation run one at a time, in order; other
// conversations are not held up.
func testTurnsInOrder(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	a, b := f.conversation(), f.conversation()
	a1, a2, a3 := f.enqueue(a.ID, "a1"), f.enqueue(a.ID, "a2"), f.enqueue(a.ID, "a3")
	b1 := f.enqueue(b.ID, "b1")
	if a2.Seq != 2 || a3.Seq != 3 || b1.Seq != 1 {
		t.Fatalf("seqs = %d %d %d", a2.Seq, a3.Seq, b1.Seq)
	}
	c := f.claim(T0)
	if c.JobID != a1.ID {
		t.Fatalf("first claim = %s, want a1", c.JobID)
	}
	if c2 := f.claim(T0); c2.JobID != b1.ID {
		t.Fatalf("second claim = %s, want b1 (a2 must wait for a1)", c2.JobID)
	}
	if _, ok := f.tryClaim(f.host, T0); ok {
		t.Fatal("claimed a2 while a1 runs")
	}
	f.admit(c, T0)
	f.settle(c, 1, T0)
	f.finish(c, wire.OutcomeSucceeded, T0)
	if c := f.claim(T0); c.JobID != a2.ID {
		t.Fatalf("after a1: claimed %s, want a2", c.JobID)
	}
	// Cancelling the queued a3 ends it at once; a turn enqueued after it
	// then waits only for a2.
	if _, err := st.CancelJob(f.ctx, a3.ID, T0); err != nil {
		t.Fatal(err)
	}
	a4 := f.enqueue(a.ID, "a4")
	if _, ok := f.tryClaim(f.host, T0); ok {
		t.Fatal("claimed a4 while a2 runs")
	}
	if a4.Seq != 4 {
		t.Fatalf("a4 seq = %d", a4.Seq)
	}
}

// P1: the generation grows with every lease of a job, and every
// attempt-scoped write with an older one, or after expiry, is refused
// and kept as a lease.stale_report event.
func testP1StaleWritesRefused(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	conv := f.conversation()
	j := f.enqueue(conv.ID, "p")
	c1 := f.claim(T0)
	if err := st.Release(f.ctx, ref(c1), wire.ReleaseRequest{AttemptRef: ref(c1), Class: "spawn_failed"}, T0); err != nil {
		t.Fatalf("Release: %v", err)
	}
	c2 := f.claim(at(store.DefaultReleaseBackoff)) // past the release backoff (K7)
	if _, err := st.Reap(f.ctx, store.ReapParams{Now: at(TTL + 15*time.Second), Grace: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	c3 := f.claim(at(TTL + 16*time.Second))
	if c1.LeaseGeneration != 1 || c2.LeaseGeneration != 2 || c3.LeaseGeneration != 3 || c3.JobID != j.ID {
		t.Fatalf("generations = %d, %d, %d", c1.LeaseGeneration, c2.LeaseGeneration, c3.LeaseGeneration)
	}
	now := at(TTL + 17*time.Second)
	stale := []wire.AttemptRef{
		ref(c1), ref(c2), // ended attempts
		{AttemptID: c3.AttemptID, LeaseGeneration: 2}, // live attempt, older generation
	}
	before := len(f.events(j.ID, "lease.stale_report"))
	for _, r := range stale {
		for _, op := range attemptOps(st, f, r, now) {
			err := op.call()
			wantErr(t, op.name+" with "+r.AttemptID, err, store.ErrLeaseLost)
		}
	}
	reports := f.events(j.ID, "lease.stale_report")
	if got, want := len(reports)-before, len(stale)*len(attemptOps(st, f, stale[0], now)); got != want {
		t.Fatalf("%d new lease.stale_report events, want %d", got, want)
	}
	last := reports[len(reports)-1]
	var data map[string]any
	if err := json.Unmarshal(last.Data, &data); err != nil || data["op"] == nil || last.AttemptID != c3.AttemptID || !last.Time.Equal(now) {
		t.Fatalf("stale report = %+v (%v)", last, err)
	}
	// The live generation is untouched by all that.
	got := f.job(j.ID)
	if got.State != wire.JobRunning || got.Admitted || len(got.Attempts) != 3 || got.Attempts[2].State != wire.AttemptRunning {
		t.Fatalf("job after stale writes = %+v", got)
	}
	if _, err := st.Renew(f.ctx, ref(c3), TTL, now); err != nil {
		t.Fatalf("live renew: %v", err)
	}
}

// A lease not renewed in time refuses writes even before the reaper ran.
func testP1ExpiredLeaseRefused(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	conv := f.conversation()
	j := f.enqueue(conv.ID, "p")
	c := f.claim(T0)
	for _, op := range attemptOps(st, f, ref(c), at(TTL)) {
		wantErr(t, op.name+" at expiry", op.call(), store.ErrLeaseLost)
	}
	if n := len(f.events(j.ID, "lease.stale_report")); n != len(attemptOps(st, f, ref(c), T0)) {
		t.Fatalf("%d stale reports", n)
	}
	if _, err := st.Renew(f.ctx, ref(c), TTL, at(TTL-time.Millisecond)); err != nil {
		t.Fatalf("renew just before expiry: %v", err)
	}
}

type namedOp struct {
	name string
	call func() error
}

// attemptOps are all attempt-scoped writes for r at now.
func attemptOps(st store.Store, f *fixture, r wire.AttemptRef, now time.Time) []namedOp {
	ctx := f.ctx
	act := "act-" + r.AttemptID
	return []namedOp{
		{"Renew", func() error { _, err := st.Renew(ctx, r, TTL, now); return err }},
		{"AppendEvents", func() error {
			_, err := st.AppendEvents(ctx, r, []wire.Event{{Seq: 99, Type: "x"}}, now)
			return err
		}},
		{"RecordContainer", func() error {
			return st.RecordContainer(ctx, r, wire.ContainerRequest{AttemptRef: r, Backend: "docker", ContainerID: "c"}, now)
		}},
		{"Admit", func() error { _, err := st.Admit(ctx, r, act, now); return err }},
		{"Settle", func() error {
			_, err := st.Settle(ctx, r, wire.SettlementRequest{AttemptRef: r, ActivationID: act,
				Supervisor: wire.SupervisorReceipt{ActivationID: act}}, now)
			return err
		}},
		{"Notice", func() error {
			return st.Notice(ctx, r, wire.NoticeRequest{AttemptRef: r, Kind: wire.NoticeSharedWorkspaceSettled}, now)
		}},
		{"Abandon", func() error {
			_, err := st.Abandon(ctx, r, wire.AbandonRequest{AttemptRef: r, Class: "x"}, now)
			return err
		}},
		{"Release", func() error {
			return st.Release(ctx, r, wire.ReleaseRequest{AttemptRef: r, Class: "stale-test"}, now)
		}},
		{"Finish", func() error {
			_, err := st.Finish(ctx, r, wire.FinishRequest{AttemptRef: r, Outcome: wire.OutcomeFailed, Class: "stale-test"}, now)
			return err
		}},
	}
}

// P2: the same terminal report twice gets the first answer, even after
// the lease has run out; another report is refused.
func testP2SameFinishTwice(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	conv := f.conversation()
	f.enqueue(conv.ID, "p")
	c := f.claim(T0)
	req := wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeFailed, Class: "agent_exit", Reason: "exit 3"}
	first, err := st.Finish(f.ctx, ref(c), req, at(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for _, now := range []time.Time{at(2 * time.Second), at(10 * TTL)} {
		again, err := st.Finish(f.ctx, ref(c), req, now)
		if err != nil || again != first {
			t.Fatalf("repeated finish at %v = %+v, %v; want %+v", now.Sub(T0), again, err, first)
		}
	}
	other := req
	other.Outcome = wire.OutcomeCancelled
	_, err = st.Finish(f.ctx, ref(c), other, at(3*time.Second))
	wantErr(t, "a different finish", err, store.ErrLeaseLost)
	if n := len(f.events(c.JobID, "finished")); n != 1 {
		t.Fatalf("%d finished events, want 1", n)
	}

	// Abandon is a terminal report too.
	f.enqueue(conv.ID, "q")
	c2 := f.claim(at(5 * time.Second))
	areq := wire.AbandonRequest{AttemptRef: ref(c2), Class: "image_missing"}
	a1, err := st.Abandon(f.ctx, ref(c2), areq, at(6*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	a2, err := st.Abandon(f.ctx, ref(c2), areq, at(7*time.Second))
	if err != nil || a1 != a2 || a1.JobState != wire.JobFailed || a1.ConversationState != wire.ConversationUsable {
		t.Fatalf("abandon twice = %+v / %+v, %v", a1, a2, err)
	}
}

// R19: attempts keep lease_owner and lease_expires_at, and the job keeps
// timestamped events of its transitions (not of every renewal).
func testR19LeaseOwnerAndEvents(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	conv := f.conversation()
	j := f.enqueue(conv.ID, "p")
	c := f.claim(at(time.Second))
	for i := 1; i <= 3; i++ {
		if _, err := st.Renew(f.ctx, ref(c), TTL, at(time.Duration(i)*30*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	got := f.job(j.ID)
	a := got.Attempts[0]
	if a.LeaseOwner != "host-a" || !a.LeaseExpiresAt.Equal(at(90*time.Second+TTL)) || !a.ClaimedAt.Equal(at(time.Second)) || a.Generation != 1 {
		t.Fatalf("attempt = %+v", a)
	}
	if _, err := st.CancelJob(f.ctx, j.ID, at(100*time.Second)); err != nil {
		t.Fatal(err)
	}
	f.admit(c, at(101*time.Second))
	f.settle(c, 1, at(102*time.Second))
	f.finish(c, wire.OutcomeSucceeded, at(103*time.Second))
	want := []struct {
		typ  string
		when time.Time
	}{
		{"queued", T0}, {"claimed", at(time.Second)}, {"cancel_requested", at(100 * time.Second)},
		{"admitted", at(101 * time.Second)}, {"settled", at(102 * time.Second)}, {"finished", at(103 * time.Second)},
	}
	evs := f.job(j.ID).Events
	if len(evs) != len(want) {
		t.Fatalf("events = %+v, want %d (no event per renewal)", evs, len(want))
	}
	for i, w := range want {
		e := evs[i]
		if e.Type != w.typ || !e.Time.Equal(w.when) || e.Source != "control" || e.JobID != j.ID || (i > 0 && e.ID <= evs[i-1].ID) {
			t.Fatalf("event %d = %+v, want %s at %v", i, e, w.typ, w.when.Sub(T0))
		}
	}
	var claimed map[string]any
	if err := json.Unmarshal(evs[1].Data, &claimed); err != nil || claimed["lease_owner"] != "host-a" || evs[1].AttemptID != c.AttemptID {
		t.Fatalf("claimed event data = %s", evs[1].Data)
	}
	// Released, abandoned and superseded attempts leave their events too.
	f.enqueue(conv.ID, "q")
	c2 := f.claim(at(200 * time.Second))
	if err := st.Release(f.ctx, ref(c2), wire.ReleaseRequest{AttemptRef: ref(c2), Class: "spawn_failed"}, at(201*time.Second)); err != nil {
		t.Fatal(err)
	}
	c3 := f.claim(at(201*time.Second + store.DefaultReleaseBackoff))
	if _, err := st.Abandon(f.ctx, ref(c3), wire.AbandonRequest{AttemptRef: ref(c3), Class: "preflight"}, at(207*time.Second)); err != nil {
		t.Fatal(err)
	}
	j3 := f.enqueue(conv.ID, "r")
	f.claim(at(300 * time.Second))
	if _, err := st.Reap(f.ctx, store.ReapParams{Now: at(300*time.Second + TTL + time.Minute), Grace: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct{ job, typ string }{{c2.JobID, "released"}, {c3.JobID, "abandoned"}, {j3.ID, "attempt_superseded"}} {
		if evs := f.events(w.job, w.typ); len(evs) != 1 || evs[0].Time.IsZero() || evs[0].AttemptID == "" {
			t.Fatalf("%s events of %s = %+v", w.typ, w.job, evs)
		}
	}
	sup := f.events(j3.ID, "attempt_superseded")[0]
	var data map[string]any
	if err := json.Unmarshal(sup.Data, &data); err != nil || data["lease_owner"] != "host-a" || data["lease_expires_at"] == nil {
		t.Fatalf("attempt_superseded data = %s", sup.Data)
	}
}

// Admission repeats with the same receipt for the same attempt and
// activation; another activation is refused.
func testAdmissionIdempotent(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	conv := f.conversation()
	f.enqueue(conv.ID, "p")
	c := f.claim(T0)
	r1 := f.admit(c, at(time.Second))
	r2 := f.admit(c, at(2*time.Second))
	if r1 != r2 {
		t.Fatalf("repeated admission = %+v, want %+v", r2, r1)
	}
	_, err := st.Admit(f.ctx, ref(c), "act-other", at(3*time.Second))
	wantErr(t, "admission by another activation", err, store.ErrAdmitted)
	if n := len(f.events(c.JobID, "admitted")); n != 1 {
		t.Fatalf("%d admitted events", n)
	}
}

// R27: settlement returns the recorded boundary to the same live attempt
// and activation; repeating it bumps nothing.
func testR27SettlementIdempotent(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	conv := f.conversation()
	f.enqueue(conv.ID, "p")
	c := f.claim(T0)
	_, err := st.Settle(f.ctx, ref(c), settlement(c, 1), at(time.Second))
	wantErr(t, "settlement before admission", err, store.ErrNotAdmitted)
	wantErr(t, "notice before settlement", st.Notice(f.ctx, ref(c), wire.NoticeRequest{AttemptRef: ref(c), Kind: wire.NoticeSharedWorkspaceSettled}, at(time.Second)), store.ErrNotAdmitted)
	f.admit(c, at(2*time.Second))
	b1 := f.settle(c, 7, at(3*time.Second))
	conv1 := f.conv(conv.ID)
	for i := 0; i < 3; i++ {
		b := f.settle(c, 8+int64(i), at(time.Duration(4+i)*time.Second)) // even a different native turn
		if b != b1 {
			t.Fatalf("repeat %d: boundary = %+v, want %+v", i, b, b1)
		}
	}
	conv2 := f.conv(conv.ID)
	if conv1.Epoch != 1 || conv2.Epoch != 1 || conv2.NativeTurn != 7 || b1.NativeTurn != 7 || b1.WorkspaceEpoch != 1 {
		t.Fatalf("after repeats: conversation epoch %d native turn %d, boundary %+v", conv2.Epoch, conv2.NativeTurn, b1)
	}
	if n := len(f.events(c.JobID, "settled")); n != 1 {
		t.Fatalf("%d settled events (snapshots), want 1", n)
	}
	other := settlement(c, 7)
	other.ActivationID, other.Supervisor.ActivationID = "act-other", "act-other"
	_, err = st.Settle(f.ctx, ref(c), other, at(8*time.Second))
	wantErr(t, "settlement by another activation", err, store.ErrLeaseLost)
	f.finish(c, wire.OutcomeSucceeded, at(9*time.Second))
	_, err = st.Settle(f.ctx, ref(c), settlement(c, 7), at(10*time.Second))
	wantErr(t, "settlement after finish", err, store.ErrLeaseLost)
	// The next turn's settlement moves the boundary on by exactly one.
	f.enqueue(conv.ID, "q")
	c2 := f.claim(at(11 * time.Second))
	f.admit(c2, at(12*time.Second))
	if b := f.settle(c2, 8, at(13*time.Second)); b.WorkspaceEpoch != 2 || b.SnapshotID == b1.SnapshotID {
		t.Fatalf("second turn's boundary = %+v", b)
	}
}

// R29: abandoning before admission fails the turn and keeps the
// conversation usable; the next message runs.
func testR29AbandonKeepsConversation(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	conv := f.conversation()
	j := f.enqueue(conv.ID, "p")
	c := f.claim(T0)
	if err := st.RecordContainer(f.ctx, ref(c), wire.ContainerRequest{AttemptRef: ref(c), Backend: "docker", ContainerID: "ctr"}, T0); err != nil {
		t.Fatal(err)
	}
	r, err := st.Abandon(f.ctx, ref(c), wire.AbandonRequest{AttemptRef: ref(c), Class: "activation_failed"}, at(time.Second))
	if err != nil || r.JobState != wire.JobFailed || r.ConversationState != wire.ConversationUsable {
		t.Fatalf("Abandon = %+v, %v", r, err)
	}
	got := f.job(j.ID)
	if got.State != wire.JobFailed || got.Attempts[0].State != wire.AttemptAbandoned || got.Reason == "" {
		t.Fatalf("job = %+v", got)
	}
	f.enqueue(conv.ID, "q")
	if c2 := f.claim(at(2 * time.Second)); c2.Turn.ContainerID != "ctr" {
		t.Fatalf("next turn = %+v", c2.Turn)
	}
}

// R30: abandon only releases never-admitted turns; an admitted turn that
// ends unsettled is never queued again and quarantines its conversation
// (K13), whose queued turns stay (an admission whose answer never came:
// testR30AmbiguousAdmissionNeedsEvidence).
func testR30AdmittedTurnNeverRequeued(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	cases := []struct {
		name string
		req  func(c wire.Claim) wire.FinishRequest
	}{
		{"failed after admission", func(c wire.Claim) wire.FinishRequest {
			return wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeFailed, Class: "agent_crash"}
		}},
		{"cancelled after admission", func(c wire.Claim) wire.FinishRequest {
			return wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeCancelled}
		}},
		{"worker lost after admission", func(c wire.Claim) wire.FinishRequest {
			return wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeWorkerLost}
		}},
	}
	for _, tc := range cases {
		conv := f.conversation()
		j := f.enqueue(conv.ID, "p")
		queued := f.enqueue(conv.ID, "behind")
		c := f.claim(T0)
		f.admit(c, T0)
		_, err := st.Abandon(f.ctx, ref(c), wire.AbandonRequest{AttemptRef: ref(c), Class: "x"}, at(time.Second))
		wantErr(t, tc.name+": abandon after admission", err, store.ErrAdmitted)
		want := wire.ConversationQuarantined
		r, err := st.Finish(f.ctx, ref(c), tc.req(c), at(2*time.Second))
		if err != nil || r.ConversationState != want || r.JobState == wire.JobQueued || r.JobState == wire.JobSucceeded {
			t.Fatalf("%s: finish = %+v, %v; want conversation %s", tc.name, r, err, want)
		}
		if got := f.job(j.ID); got.State == wire.JobQueued || len(got.Attempts) != 1 {
			t.Fatalf("%s: the turn was queued again: %+v", tc.name, got)
		}
		cv := f.conv(conv.ID)
		if got := f.job(queued.ID); got.State != wire.JobQueued {
			t.Fatalf("%s: the turn behind it = %+v, want queued", tc.name, got)
		}
		if cv.State != wire.ConversationQuarantined || cv.InterruptedJobID != j.ID || cv.LostReason != "" {
			t.Fatalf("%s: conversation = %+v", tc.name, cv)
		}
		// The next turn is the one behind, never the interrupted one again.
		next := f.claim(at(3 * time.Second))
		if next.JobID != queued.ID || !next.Turn.Quarantined {
			t.Fatalf("%s: next claim = %+v, want %s quarantined", tc.name, next, queued.ID)
		}
		f.finish(next, wire.OutcomeFailed, at(4*time.Second))
	}
	if _, ok := f.tryClaim(f.host, at(time.Minute)); ok {
		t.Fatal("a turn was claimed again")
	}
}

// R32: a LOST conversation refuses new messages; owner-facing wording is
// plain language, without infrastructure detail.
func testR32LostConversationRefusesMessages(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	conv := f.conversation()
	f.enqueue(conv.ID, "p")
	c := f.claim(T0)
	f.admit(c, T0)
	if _, err := st.Finish(f.ctx, ref(c), wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeFailed,
		Class: "workspace_missing", Unrecoverable: true}, at(time.Second)); err != nil {
		t.Fatal(err)
	}
	_, err := st.EnqueueTurn(f.ctx, conv.ID, "are you there?", at(2*TTL))
	wantErr(t, "EnqueueTurn on a LOST conversation", err, store.ErrConversationLost)
	cv := f.conv(conv.ID)
	j := f.job(c.JobID)
	for _, text := range []string{cv.LostReason, j.Reason} {
		if text == "" {
			t.Fatalf("empty owner-facing reason: conversation %+v, job %+v", cv, j)
		}
		low := strings.ToLower(text)
		for _, word := range []string{"lease", "attempt", "generation", "superseded", "reaper", "admission", "admitted", "worker", "sql", "error", c.AttemptID, c.JobID} {
			if strings.Contains(low, strings.ToLower(word)) {
				t.Fatalf("owner-facing text %q contains infrastructure detail %q", text, word)
			}
		}
	}
	// Lost stays lost: a new host's claim does not bring it back.
	if _, ok := f.tryClaim(f.newHost("host-b"), at(3*TTL)); ok {
		t.Fatal("claimed a turn of a LOST conversation")
	}
	if cv := f.conv(conv.ID); cv.State != wire.ConversationLost {
		t.Fatalf("conversation = %+v", cv)
	}
}

// R36: release requeues only a never-admitted turn of the live attempt;
// the statement itself refuses an admitted one.
func testR36ReleaseRefusedAfterAdmission(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	conv := f.conversation()
	j := f.enqueue(conv.ID, "p")
	c := f.claim(T0)
	rel := wire.ReleaseRequest{AttemptRef: ref(c), Class: "payload_undelivered"}
	if err := st.Release(f.ctx, ref(c), rel, at(time.Second)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := st.Release(f.ctx, ref(c), rel, at(2*time.Second)); err != nil {
		t.Fatalf("Release again: %v", err)
	}
	got := f.job(j.ID)
	if got.State != wire.JobQueued || got.AttemptCount != 0 || got.Attempts[0].State != wire.AttemptReleased || got.Attempts[0].CountsAsAttempt {
		t.Fatalf("job after release = %+v", got)
	}
	c2 := f.claim(at(time.Second + store.DefaultReleaseBackoff))
	f.admit(c2, at(7*time.Second))
	err := st.Release(f.ctx, ref(c2), wire.ReleaseRequest{AttemptRef: ref(c2), Class: "declined:preflight"}, at(8*time.Second))
	wantErr(t, "Release after admission", err, store.ErrAdmitted)
	if got := f.job(j.ID); got.State != wire.JobRunning || !got.Admitted || got.Attempts[1].State != wire.AttemptRunning {
		t.Fatalf("job after refused release = %+v", got)
	}
}

// P4: after the control plane's own absence every running lease gets a
// full TTL from its return, so the reaper does not blame the workers.
func testP4ResumeAfterAbsence(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	gap := time.Minute
	if n, err := st.ResumeAfterAbsence(f.ctx, T0, gap); err != nil || n != 0 {
		t.Fatalf("first ResumeAfterAbsence = %d, %v", n, err)
	}
	conv1, conv2 := f.conversation(), f.conversation()
	f.enqueue(conv1.ID, "p")
	f.enqueue(conv2.ID, "q")
	c1 := f.claim(T0)
	c2 := f.claim(T0)
	if _, err := st.Renew(f.ctx, ref(c2), 10*time.Minute, at(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if n, err := st.ResumeAfterAbsence(f.ctx, at(30*time.Second), gap); err != nil || n != 0 {
		t.Fatalf("ResumeAfterAbsence within the gap = %d, %v", n, err)
	}
	// Down from 30 s to 5 min: c1's lease (to 120 s) ran out meanwhile.
	back := at(5 * time.Minute)
	n, err := st.ResumeAfterAbsence(f.ctx, back, gap)
	if err != nil || n != 2 {
		t.Fatalf("ResumeAfterAbsence after absence = %d, %v; want 2", n, err)
	}
	res, err := st.Reap(f.ctx, store.ReapParams{Now: back, Grace: 10 * time.Second})
	if err != nil || res.Superseded != 0 {
		t.Fatalf("Reap on return = %+v, %v", res, err)
	}
	a := f.job(c1.JobID).Attempts[0]
	if !a.LeaseExpiresAt.Equal(back.Add(TTL)) || a.State != wire.AttemptRunning {
		t.Fatalf("c1 lease = %+v, want a full TTL from %v", a, back.Sub(T0))
	}
	if a2 := f.job(c2.JobID).Attempts[0]; !a2.LeaseExpiresAt.Equal(back.Add(10 * time.Minute)) {
		t.Fatalf("c2 lease = %+v, want its own full TTL (10 min) from the return", a2)
	}
	if _, err := st.Renew(f.ctx, ref(c1), TTL, back.Add(time.Second)); err != nil {
		t.Fatalf("renew after the return: %v", err)
	}
	if len(f.events(c1.JobID, "lease_extended_after_absence")) != 1 {
		t.Fatal("no lease_extended_after_absence event")
	}
	// A worker that really went silent still loses its lease afterwards,
	// while the control plane sweeps as it should.
	for d := time.Duration(0); d <= 11*time.Minute; d += gap / 2 {
		if n, err := st.ResumeAfterAbsence(f.ctx, back.Add(d), gap); err != nil || n != 0 {
			t.Fatalf("ResumeAfterAbsence while present = %d, %v", n, err)
		}
	}
	res, err = st.Reap(f.ctx, store.ReapParams{Now: back.Add(11 * time.Minute), Grace: 10 * time.Second})
	if err != nil || res.Superseded != 2 {
		t.Fatalf("later Reap = %+v, %v", res, err)
	}
}

// P3: the reaper waits for expiry plus grace.
func testP3ReaperWaitsForGrace(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	conv := f.conversation()
	f.enqueue(conv.ID, "p")
	c := f.claim(T0)
	grace := 15 * time.Second
	res, err := st.Reap(f.ctx, store.ReapParams{Now: at(TTL + grace), Grace: grace})
	if err != nil || res.Superseded != 0 {
		t.Fatalf("Reap at expiry+grace = %+v, %v", res, err)
	}
	res, err = st.Reap(f.ctx, store.ReapParams{Now: at(TTL + grace + time.Millisecond), Grace: grace})
	if err != nil || res.Superseded != 1 || res.Requeued != 1 {
		t.Fatalf("Reap after expiry+grace = %+v, %v", res, err)
	}
	if a := f.job(c.JobID).Attempts[0]; a.State != wire.AttemptSuperseded {
		t.Fatalf("attempt = %+v", a)
	}
	// Limit bounds one sweep; the next sweep takes the rest.
	for i := 0; i < 3; i++ {
		f.enqueue(f.conversation().ID, "more")
	}
	c2 := f.claim(at(time.Hour)) // the requeued job first: it is the oldest
	f.claim(at(time.Hour))
	f.claim(at(time.Hour))
	f.claim(at(time.Hour))
	if c2.JobID != c.JobID {
		t.Fatalf("claimed %s first, want the requeued %s", c2.JobID, c.JobID)
	}
	later := at(time.Hour + TTL + grace + time.Second)
	if res, err := st.Reap(f.ctx, store.ReapParams{Now: later, Grace: grace, Limit: 3}); err != nil || res.Superseded != 3 {
		t.Fatalf("Reap with Limit 3 = %+v, %v", res, err)
	}
	if res, err := st.Reap(f.ctx, store.ReapParams{Now: later, Grace: grace, Limit: 3}); err != nil || res.Superseded != 1 {
		t.Fatalf("second Reap = %+v, %v", res, err)
	}
}

// P6: a host lost before admission requeues the job without counting an
// attempt, through the reaper or a restarted daemon's worker_lost; past
// the cap the job fails with a plain reason.
func testP6WorkerLostNotCounted(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	conv := f.conversation()
	j := f.enqueue(conv.ID, "p")
	c1 := f.claim(T0)
	res, err := st.Reap(f.ctx, store.ReapParams{Now: at(TTL + time.Minute), Grace: 10 * time.Second, MaxWorkerLost: 2})
	if err != nil || res != (store.ReapResult{Superseded: 1, Requeued: 1}) {
		t.Fatalf("Reap = %+v, %v", res, err)
	}
	got := f.job(j.ID)
	if got.State != wire.JobQueued || got.AttemptCount != 0 || got.WorkerLostCount != 1 || got.Attempts[0].CountsAsAttempt {
		t.Fatalf("after reap: %+v", got)
	}
	c2 := f.claim(at(3 * time.Minute))
	r, err := st.Finish(f.ctx, ref(c2), wire.FinishRequest{AttemptRef: ref(c2), Outcome: wire.OutcomeWorkerLost}, at(3*time.Minute+time.Second))
	if err != nil || r.JobState != wire.JobQueued || r.ConversationState != wire.ConversationUsable {
		t.Fatalf("Finish(worker_lost) = %+v, %v", r, err)
	}
	got = f.job(j.ID)
	if got.AttemptCount != 0 || got.WorkerLostCount != 2 || got.Attempts[1].State != wire.AttemptWorkerLost || got.Attempts[1].CountsAsAttempt {
		t.Fatalf("after worker_lost: %+v", got)
	}
	c3 := f.claim(at(4 * time.Minute))
	if c3.LeaseGeneration != 3 || c1.LeaseGeneration != 1 {
		t.Fatalf("generation = %d", c3.LeaseGeneration)
	}
	res, err = st.Reap(f.ctx, store.ReapParams{Now: at(4*time.Minute + TTL + time.Minute), Grace: 10 * time.Second, MaxWorkerLost: 2})
	if err != nil || res != (store.ReapResult{Superseded: 1, FailedWorkerLostCap: 1}) {
		t.Fatalf("Reap past the cap = %+v, %v", res, err)
	}
	got = f.job(j.ID)
	if got.State != wire.JobFailed || got.WorkerLostCount != 3 || !strings.Contains(got.Reason, "3 times") {
		t.Fatalf("after the cap: %+v", got)
	}
	if cv := f.conv(conv.ID); cv.State != wire.ConversationUsable {
		t.Fatalf("conversation = %+v; a never-admitted turn leaves it usable", cv)
	}
	if len(f.events(j.ID, "worker_lost_cap")) != 1 {
		t.Fatal("no worker_lost_cap event")
	}
}

// R35: an admitted turn whose lease the reaper supersedes is never queued
// again; its conversation is quarantined (K13), not lost.
func testR35ReaperQuarantinesAdmittedConversation(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	conv := f.conversation()
	j := f.enqueue(conv.ID, "p")
	c := f.claim(T0)
	f.admit(c, T0)
	res, err := st.Reap(f.ctx, store.ReapParams{Now: at(TTL + time.Minute), Grace: 10 * time.Second})
	if err != nil || res != (store.ReapResult{Superseded: 1, ConversationsQuarantined: 1}) {
		t.Fatalf("Reap = %+v, %v", res, err)
	}
	if got := f.job(j.ID); got.State != wire.JobFailed || got.Attempts[0].State != wire.AttemptSuperseded {
		t.Fatalf("job = %+v", got)
	}
	if cv := f.conv(conv.ID); cv.State != wire.ConversationQuarantined || cv.InterruptedJobID != j.ID {
		t.Fatalf("conversation = %+v", cv)
	}
	if _, ok := f.tryClaim(f.host, at(TTL+time.Minute)); ok {
		t.Fatal("the superseded admitted turn was claimed again")
	}
	// The old runner's late finish is refused and recorded.
	_, err = st.Finish(f.ctx, ref(c), wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeSucceeded}, at(TTL+2*time.Minute))
	wantErr(t, "late finish", err, store.ErrLeaseLost)
	if len(f.events(j.ID, "lease.stale_report")) != 1 {
		t.Fatal("late finish left no lease.stale_report")
	}
}

// P7: cancelling a queued job ends it at once; a running one gets the
// flag in its renewal answer and keeps its lease until it ends.
func testP7Cancel(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	conv := f.conversation()
	run := f.enqueue(conv.ID, "running")
	queued := f.enqueue(conv.ID, "queued")
	c := f.claim(T0)
	j, err := st.CancelJob(f.ctx, queued.ID, at(time.Second))
	if err != nil || j.State != wire.JobCancelled || j.EndedAt == nil || !j.CancelRequested {
		t.Fatalf("cancel queued = %+v, %v", j, err)
	}
	_, err = st.CancelJob(f.ctx, queued.ID, at(2*time.Second))
	wantErr(t, "cancel of an ended job", err, store.ErrGone)
	_, err = st.CancelJob(f.ctx, "job_nope", at(2*time.Second))
	wantErr(t, "cancel of an unknown job", err, store.ErrNotFound)

	if r, err := st.Renew(f.ctx, ref(c), TTL, at(3*time.Second)); err != nil || r.CancelRequested {
		t.Fatalf("renew before cancel = %+v, %v", r, err)
	}
	j, err = st.CancelJob(f.ctx, run.ID, at(4*time.Second))
	if err != nil || j.State != wire.JobRunning || !j.CancelRequested {
		t.Fatalf("cancel running = %+v, %v", j, err)
	}
	for i := 0; i < 2; i++ {
		r, err := st.Renew(f.ctx, ref(c), TTL, at(time.Duration(5+i)*time.Second))
		if err != nil || !r.CancelRequested {
			t.Fatalf("renew after cancel = %+v, %v", r, err)
		}
	}
	r, err := st.Finish(f.ctx, ref(c), wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeCancelled}, at(7*time.Second))
	if err != nil || r.JobState != wire.JobCancelled || r.ConversationState != wire.ConversationUsable {
		t.Fatalf("finish cancelled = %+v, %v", r, err)
	}
	// A cancelled turn that is released, or whose host is lost, is not
	// queued again: an ended lease is never reused.
	for _, end := range []string{"release", "reap"} {
		j := f.enqueue(conv.ID, end)
		c := f.claim(at(10 * time.Second))
		if _, err := st.CancelJob(f.ctx, j.ID, at(11*time.Second)); err != nil {
			t.Fatal(err)
		}
		switch end {
		case "release":
			if err := st.Release(f.ctx, ref(c), wire.ReleaseRequest{AttemptRef: ref(c), Class: "spawn_failed"}, at(12*time.Second)); err != nil {
				t.Fatal(err)
			}
		case "reap":
			if _, err := st.Reap(f.ctx, store.ReapParams{Now: at(10*time.Second + TTL + time.Minute), Grace: time.Second}); err != nil {
				t.Fatal(err)
			}
		}
		if got := f.job(j.ID); got.State != wire.JobCancelled {
			t.Fatalf("cancelled then %s: job = %+v", end, got)
		}
	}
}

// Runner events are idempotent by sequence; JobEvents pages by id.
func testEventsIdempotent(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	conv := f.conversation()
	j := f.enqueue(conv.ID, "p")
	c := f.claim(T0)
	batch := []wire.Event{{Seq: 1, Type: "a", Time: at(time.Second)}, {Seq: 2, Type: "b", Data: []byte(`{"n":2}`)}}
	for i := 0; i < 2; i++ {
		r, err := st.AppendEvents(f.ctx, ref(c), batch, at(2*time.Second))
		if err != nil || r.StoredThrough != 2 {
			t.Fatalf("append %d = %+v, %v", i, r, err)
		}
	}
	r, err := st.AppendEvents(f.ctx, ref(c), []wire.Event{{Seq: 2, Type: "b"}, {Seq: 3, Type: "c"}}, at(3*time.Second))
	if err != nil || r.StoredThrough != 3 {
		t.Fatalf("append overlapping = %+v, %v", r, err)
	}
	var runner []wire.JobEvent
	all, err := st.JobEvents(f.ctx, j.ID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range all {
		if e.Source == "runner" {
			runner = append(runner, e)
		}
	}
	if len(runner) != 3 || runner[0].Type != "a" || !runner[0].Time.Equal(at(time.Second)) || string(runner[1].Data) != `{"n":2}` ||
		!runner[2].Time.Equal(at(3*time.Second)) || runner[0].AttemptID != c.AttemptID {
		t.Fatalf("runner events = %+v", runner)
	}
	page, err := st.JobEvents(f.ctx, j.ID, all[0].ID, 2)
	if err != nil || len(page) != 2 || page[0].ID != all[1].ID || page[1].ID != all[2].ID {
		t.Fatalf("page = %+v, %v", page, err)
	}
	_, err = st.JobEvents(f.ctx, "job_nope", 0, 0)
	wantErr(t, "events of an unknown job", err, store.ErrNotFound)
}
