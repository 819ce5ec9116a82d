package storetest

import (
	"maps"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// testRenewAs: the worker's renewal authorizes and fences in one
// statement, and refuses exactly as AuthorizeAttempt and Renew do, the
// stale report included.
func testRenewAs(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	conv1, conv2 := f.conversation(), f.conversation()
	j1, j2 := f.enqueue(conv1.ID, "one"), f.enqueue(conv2.ID, "two")
	c1, c2 := f.claim(T0), f.claim(T0)
	if c1.JobID != j1.ID || c2.JobID != j2.ID {
		t.Fatalf("claims took %s, %s; want %s, %s", c1.JobID, c2.JobID, j1.ID, j2.ID)
	}
	w1 := store.Worker{JobID: j1.ID, TokenHash: Hash(tokenOf(f, c1))}

	r, err := st.RenewAs(f.ctx, w1, ref(c1), TTL, at(time.Second))
	if err != nil || !r.LeaseExpiresAt.Equal(at(time.Second+TTL)) || r.LeaseTTLMS != TTL.Milliseconds() || r.CancelRequested {
		t.Fatalf("RenewAs = %+v, %v; want the lease to %v", r, err, at(time.Second+TTL))
	}

	refusals := []struct {
		what string
		w    store.Worker
		ref  wire.AttemptRef
		want error
	}{
		{"unknown token", store.Worker{JobID: j1.ID, TokenHash: Hash("no such token")}, ref(c1), store.ErrUnauthorized},
		{"a host token", store.Worker{JobID: j1.ID, TokenHash: Hash("host-token-host-a")}, ref(c1), store.ErrUnauthorized},
		{"another job's token", store.Worker{JobID: j2.ID, TokenHash: w1.TokenHash}, ref(c2), store.ErrForbidden},
		{"unknown job", store.Worker{JobID: "job_nope", TokenHash: w1.TokenHash}, ref(c1), store.ErrNotFound},
		{"another attempt named", store.Worker{JobID: j1.ID, TokenHash: w1.TokenHash}, ref(c2), store.ErrOtherAttempt},
	}
	for _, rc := range refusals {
		_, err := st.RenewAs(f.ctx, rc.w, rc.ref, TTL, at(2*time.Second))
		wantErr(t, rc.what, err, rc.want)
	}
	if got := f.events(j1.ID, "lease.stale_report"); len(got) != 0 {
		t.Fatalf("a refused token left %d stale reports, want none: it is not the attempt's report", len(got))
	}

	stale := ref(c1)
	stale.LeaseGeneration++
	_, err = st.RenewAs(f.ctx, w1, stale, TTL, at(3*time.Second))
	wantErr(t, "another generation", err, store.ErrLeaseLost)
	if got := f.events(j1.ID, "lease.stale_report"); len(got) != 1 {
		t.Fatalf("a stale generation left %d stale reports, want 1", len(got))
	}

	if _, err := st.CancelJob(f.ctx, j1.ID, at(4*time.Second)); err != nil {
		t.Fatalf("CancelJob: %v", err)
	}
	if r, err := st.RenewAs(f.ctx, w1, ref(c1), TTL, at(5*time.Second)); err != nil || !r.CancelRequested {
		t.Fatalf("RenewAs after a cancel = %+v, %v; want cancel_requested", r, err)
	}

	// The lease renewed at 5 s runs out at 5 s + TTL.
	_, err = st.RenewAs(f.ctx, w1, ref(c1), TTL, at(5*time.Second+TTL))
	wantErr(t, "an expired lease", err, store.ErrLeaseLost)
}

// testConversationStates: many conversations' states in one read, the
// unknown ones absent, a repeated id answered once, each with the host its
// sandbox is recorded on. The foreign sandbox: host-a's attempt ends
// before it records a container, host-b's records one; the state names
// host-b, and host-a is given no later turn of the conversation, so the
// copy host-a started is garbage.
func testConversationStates(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	usable, lost := f.conversation(), f.conversation()
	if _, err := st.LoseConversation(f.ctx, lost.ID, Lost, at(time.Second)); err != nil {
		t.Fatalf("LoseConversation: %v", err)
	}
	got, err := st.ConversationStates(f.ctx, []string{lost.ID, "conv_nope", usable.ID, lost.ID})
	if err != nil {
		t.Fatalf("ConversationStates: %v", err)
	}
	want := map[string]store.ConversationState{lost.ID: {State: wire.ConversationLost}, usable.ID: {State: wire.ConversationUsable}}
	if !maps.Equal(got, want) {
		t.Fatalf("ConversationStates = %v, want %v", got, want)
	}
	if got, err := st.ConversationStates(f.ctx, nil); err != nil || len(got) != 0 {
		t.Fatalf("ConversationStates(nil) = %v, %v; want nothing", got, err)
	}

	a, b := f.host, f.newHost("host-b")
	conv := f.conversation()
	j := f.enqueue(conv.ID, "one")
	f.release(f.claimOn(a, at(2*time.Second), j.ID), "spawn_failed", at(3*time.Second))
	if got, err := st.ConversationStates(f.ctx, []string{conv.ID}); err != nil || got[conv.ID] != (store.ConversationState{State: wire.ConversationUsable}) {
		t.Fatalf("nothing recorded yet: %v, %v", got, err)
	}
	later := at(time.Minute)
	cb := f.claimOn(b, later, j.ID)
	f.recordContainer(cb, "ctr-b", later)
	got, err = st.ConversationStates(f.ctx, []string{conv.ID})
	if w := (store.ConversationState{State: wire.ConversationUsable, SandboxHostID: b.ID, SandboxHost: b.Name, SandboxState: wire.SandboxRunning}); err != nil || got[conv.ID] != w {
		t.Fatalf("recorded on host-b: %v, %v; want %+v", got, err, w)
	}
	f.enqueue(conv.ID, "two")
	f.release(cb, "spawn_failed", later) // turn one queued again, pinned to host-b
	f.claimOn(a, at(time.Hour), "")
}
