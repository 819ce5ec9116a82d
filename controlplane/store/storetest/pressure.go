package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// S1: a conversation's sandbox_state is what the host holding its sandbox
// last reported — running when a turn records the sandbox, stopped when
// the host says so — and no other host's word moves it.
func testS1SandboxState(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	a, b := f.host, f.newHost("host-b")
	conv := f.conversation()
	if got := f.conv(conv.ID); got.SandboxState != "" {
		t.Fatalf("no sandbox yet: sandbox_state %q, want empty", got.SandboxState)
	}
	j := f.enqueue(conv.ID, "one")
	c := f.claimOn(a, at(time.Second), j.ID)
	f.recordContainer(c, "ctr-a", at(2*time.Second))
	if got := f.conv(conv.ID); got.SandboxState != wire.SandboxRunning || got.SandboxHost != a.Name {
		t.Fatalf("recorded on %s: %+v, want running there", a.Name, got)
	}
	f.admit(c, at(3*time.Second))
	f.settle(c, 1, at(3*time.Second))
	f.finish(c, wire.OutcomeSucceeded, at(3*time.Second))

	// Another host's word changes nothing; the holder's does.
	if err := st.RecordSandboxStates(f.ctx, b.ID, map[string]string{conv.ID: wire.SandboxStopped}); err != nil {
		t.Fatalf("RecordSandboxStates(host-b): %v", err)
	}
	if got := f.conv(conv.ID); got.SandboxState != wire.SandboxRunning {
		t.Fatalf("after host-b's report: sandbox_state %q, want running (host-b does not hold it)", got.SandboxState)
	}
	if err := st.RecordSandboxStates(f.ctx, a.ID, map[string]string{conv.ID: wire.SandboxStopped, "conv_nope": wire.SandboxStopped}); err != nil {
		t.Fatalf("RecordSandboxStates(host-a): %v", err)
	}
	if got := f.conv(conv.ID); got.SandboxState != wire.SandboxStopped {
		t.Fatalf("after its host said stopped: sandbox_state %q", got.SandboxState)
	}
	states, err := st.ConversationStates(f.ctx, []string{conv.ID})
	if err != nil || states[conv.ID].SandboxState != wire.SandboxStopped {
		t.Fatalf("ConversationStates = %v, %v; want stopped", states, err)
	}
	// The next turn that records the sandbox (its wake) makes it running.
	j2 := f.enqueue(conv.ID, "two")
	c2 := f.claimOn(a, at(4*time.Second), j2.ID)
	f.recordContainer(c2, "ctr-a", at(5*time.Second))
	if got := f.conv(conv.ID); got.SandboxState != wire.SandboxRunning {
		t.Fatalf("after the wake recorded: sandbox_state %q, want running", got.SandboxState)
	}
	if err := st.RecordSandboxStates(f.ctx, a.ID, map[string]string{conv.ID: "paused"}); err == nil {
		t.Fatal("RecordSandboxStates took an unknown state")
	}
}

// S2: a claim with PinnedOnly (a host under pressure) takes the turns of
// conversations whose sandbox is on the host, never a first turn —
// however much older the first turn is — and a claim without it takes
// the first turn again.
func testS2PinnedOnlyClaim(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	a := f.host
	here := f.conversation()
	j := f.enqueue(here.ID, "one")
	c := f.claimOn(a, at(time.Second), j.ID)
	f.recordContainer(c, "ctr-a", at(2*time.Second))
	f.admit(c, at(3*time.Second))
	f.settle(c, 1, at(3*time.Second))
	f.finish(c, wire.OutcomeSucceeded, at(3*time.Second))

	fresh := f.conversation()
	first := f.enqueue(fresh.ID, "first") // queued before the returning turn
	returning := f.enqueue(here.ID, "two")
	pinned := func(now time.Time) (wire.Claim, bool) {
		t.Helper()
		f.n++
		token := fmt.Sprintf("worker-pinned-%d", f.n)
		cs, err := st.ClaimMany(f.ctx, store.ClaimParams{HostID: a.ID, LeaseTTL: TTL, WorkerTokenHash: Hash(token), Now: now,
			PinnedOnly: true, More: []store.ClaimSlot{{WorkerTokenHash: Hash(token + "-2")}}})
		if err != nil {
			t.Fatalf("ClaimMany(pinned only): %v", err)
		}
		if len(cs) > 1 {
			t.Fatalf("pinned-only claim took %d turns, want the one returning turn", len(cs))
		}
		if len(cs) == 0 {
			return wire.Claim{}, false
		}
		f.tokens[cs[0].AttemptID] = token
		return cs[0], true
	}
	got, ok := pinned(at(4 * time.Second))
	if !ok || got.JobID != returning.ID {
		t.Fatalf("pinned-only claim: %+v, %v; want the returning turn %s, not the first turn %s", got, ok, returning.ID, first.ID)
	}
	f.admit(got, at(5*time.Second))
	f.settle(got, 2, at(5*time.Second))
	f.finish(got, wire.OutcomeSucceeded, at(5*time.Second))
	if got, ok := pinned(at(6 * time.Second)); ok {
		t.Fatalf("pinned-only claim took %s (turn %d of %s): want no first turn", got.JobID, got.Turn.Seq, got.Turn.ConversationID)
	}
	f.claimOn(a, at(7*time.Second), first.ID)
}

// A claim says how long its turn waited since its message, on the store's
// clock (the host's queue-wait histogram): a single claim and a batch on
// each store's path, and a keyed claim's replay answers the wait up to
// the claim it replays, not up to the replay.
func testClaimSaysItsQueueWait(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	one := f.enqueue(f.conversation().ID, "one") // at T0
	waited := func(c wire.Claim) int64 {
		if c.QueuedMS == nil {
			return -1
		}
		return *c.QueuedMS
	}
	if c := f.claimOn(f.host, at(7*time.Second), one.ID); waited(c) != 7000 {
		t.Fatalf("a claim 7 s after the message says queued_ms %d, want 7000", waited(c))
	}
	a, b := f.enqueue(f.conversation().ID, "a"), f.enqueue(f.conversation().ID, "b")
	key := Hash("queue-wait-key")
	claim := func(now time.Time) []wire.Claim {
		t.Helper()
		cs, err := st.ClaimMany(f.ctx, store.ClaimParams{HostID: f.host.ID, LeaseTTL: TTL, WorkerTokenHash: Hash("w-a"), KeyHash: key, Now: now,
			More: []store.ClaimSlot{{WorkerTokenHash: Hash("w-b")}}})
		if err != nil {
			t.Fatalf("ClaimMany: %v", err)
		}
		return cs
	}
	cs := claim(at(9 * time.Second))
	if len(cs) != 2 || cs[0].JobID != a.ID || cs[1].JobID != b.ID || waited(cs[0]) != 9000 || waited(cs[1]) != 9000 {
		t.Fatalf("a batch 9 s after the messages: %+v, want both turns with queued_ms 9000", cs)
	}
	again := claim(at(10 * time.Second))
	if len(again) != 2 || !again[0].Replayed || waited(again[0]) != 9000 || waited(again[1]) != 9000 {
		t.Fatalf("the replay a second later: %+v, want the same turns with queued_ms 9000, the wait up to the claim", again)
	}
}
