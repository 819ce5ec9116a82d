package storetest

import (
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// recordContainer records a retained sandbox for the claim's attempt.
func (f *fixture) recordContainer(c wire.Claim, id string, now time.Time) {
	f.t.Helper()
	if err := f.st.RecordContainer(f.ctx, ref(c), wire.ContainerRequest{AttemptRef: ref(c), Backend: "docker", ContainerID: id}, now); err != nil {
		f.t.Fatalf("RecordContainer: %v", err)
	}
}

// claimOn claims the next job on host h and fails unless it is want
// ("" for none).
func (f *fixture) claimOn(h store.Host, now time.Time, want string) wire.Claim {
	f.t.Helper()
	c, ok := f.tryClaim(h, now)
	switch {
	case want == "" && ok:
		f.t.Fatalf("%s claimed %s (turn %d of %s), want nothing", h.Name, c.JobID, c.Turn.Seq, c.Turn.ConversationID)
	case want != "" && !ok:
		f.t.Fatalf("%s claimed nothing, want %s", h.Name, want)
	case c.JobID != want:
		f.t.Fatalf("%s claimed %s, want %s", h.Name, c.JobID, want)
	}
	return c
}

// A conversation's retained sandbox lives on the host whose attempt last
// recorded it; only that host is given the conversation's turns, a
// requeued turn included. A conversation with no sandbox goes to any host,
// and a host still takes the oldest turn it may run.
func testAffinityTurnsGoToSandboxHost(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	a, b := f.host, f.newHost("host-b")

	// No sandbox yet: any host may take it.
	pinned := f.conversation()
	if cv := f.conv(pinned.ID); cv.SandboxHost != "" {
		t.Fatalf("new conversation has sandbox host %q", cv.SandboxHost)
	}
	t1 := f.enqueue(pinned.ID, "one")
	c1 := f.claimOn(a, at(0), t1.ID)
	f.recordContainer(c1, "ctr-a", at(time.Second))
	if cv := f.conv(pinned.ID); cv.SandboxHost != a.Name || cv.ContainerID != "ctr-a" {
		t.Fatalf("after host-a recorded its container: sandbox host %q, container %q", cv.SandboxHost, cv.ContainerID)
	}
	t2 := f.enqueue(pinned.ID, "two") // queued while turn 1 runs
	f.admit(c1, at(2*time.Second))
	f.settle(c1, 1, at(3*time.Second))
	f.finish(c1, wire.OutcomeSucceeded, at(4*time.Second))

	// Turn 2 waits for host-a; host-b takes a later turn of a conversation
	// without a sandbox, then finds nothing.
	free := f.conversation()
	t3 := f.enqueue(free.ID, "three")
	f.claimOn(b, at(5*time.Second), t3.ID)
	f.claimOn(b, at(5*time.Second), "")
	c2 := f.claimOn(a, at(6*time.Second), t2.ID)
	if c2.Turn.ContainerID != "ctr-a" {
		t.Fatalf("turn 2 carries container %q, want ctr-a", c2.Turn.ContainerID)
	}
	f.admit(c2, at(7*time.Second))
	f.settle(c2, 2, at(7*time.Second))
	f.finish(c2, wire.OutcomeSucceeded, at(7*time.Second))

	// host-a takes the oldest turn it may run, pinned or free.
	other := f.conversation()
	t4 := f.enqueue(other.ID, "four")
	t5 := f.enqueue(pinned.ID, "five")
	f.claimOn(a, at(8*time.Second), t4.ID)
	f.claimOn(a, at(8*time.Second), t5.ID)

	// A turn requeued after its attempt recorded a sandbox goes back to
	// that host only (worker lost before admission, P6).
	moved := f.conversation()
	t6 := f.enqueue(moved.ID, "six")
	c6 := f.claimOn(b, at(9*time.Second), t6.ID)
	f.recordContainer(c6, "ctr-b", at(10*time.Second))
	if _, err := st.Finish(f.ctx, ref(c6), wire.FinishRequest{AttemptRef: ref(c6), Outcome: wire.OutcomeWorkerLost}, at(11*time.Second)); err != nil {
		t.Fatalf("Finish(worker_lost): %v", err)
	}
	if j := f.job(t6.ID); j.State != wire.JobQueued {
		t.Fatalf("turn 6 after worker_lost is %s, want queued", j.State)
	}
	f.claimOn(a, at(12*time.Second), "")
	f.claimOn(b, at(12*time.Second), t6.ID)

	list, err := st.ListConversations(f.ctx)
	if err != nil {
		t.Fatalf("ListConversations: %v", err)
	}
	want := map[string]string{pinned.ID: a.Name, free.ID: "", other.ID: "", moved.ID: b.Name}
	for _, cv := range list {
		if cv.SandboxHost != want[cv.ID] {
			t.Errorf("conversation %s lists sandbox host %q, want %q", cv.ID, cv.SandboxHost, want[cv.ID])
		}
	}
}

// When the host holding a sandbox is gone for good, an operator marks the
// conversation LOST: its waiting turns fail in plain words and it takes no
// new message. Not while a turn of it runs (its lease decides), and a
// refused call leaves the queue as it was.
func testAffinityOperatorLosesConversation(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	a, b := f.host, f.newHost("host-b")
	conv := f.conversation()
	t1 := f.enqueue(conv.ID, "one")
	c1 := f.claimOn(a, at(0), t1.ID)
	f.recordContainer(c1, "ctr-a", at(time.Second))
	t2 := f.enqueue(conv.ID, "two")

	// A turn runs: refused, and nothing changes.
	_, err := st.LoseConversation(f.ctx, conv.ID, Lost, at(2*time.Second))
	wantErr(t, "LoseConversation while a turn runs", err, store.ErrInvalid)
	f.admit(c1, at(3*time.Second))
	f.settle(c1, 1, at(3*time.Second))
	f.finish(c1, wire.OutcomeSucceeded, at(3*time.Second))
	if cv := f.conv(conv.ID); cv.State != wire.ConversationUsable {
		t.Fatalf("refused call left the conversation %s", cv.State)
	}
	t3 := f.enqueue(conv.ID, "three")

	// host-a is gone: turn 2 waits; the operator loses the conversation.
	f.claimOn(b, at(4*time.Second), "")
	cv, err := st.LoseConversation(f.ctx, conv.ID, Lost, at(5*time.Second))
	if err != nil || cv.State != wire.ConversationLost || cv.LostReason == "" {
		t.Fatalf("LoseConversation = %+v, %v", cv, err)
	}
	for _, word := range []string{"lease", "attempt", "host", "sandbox", "container", "worker", "operator", "error"} {
		if strings.Contains(strings.ToLower(cv.LostReason), word) {
			t.Fatalf("lost reason %q is not plain language: it says %q (R32)", cv.LostReason, word)
		}
	}
	for _, id := range []string{t2.ID, t3.ID} {
		if j := f.job(id); j.State != wire.JobFailed || j.Reason == "" || j.EndedAt == nil || !hasEvent(j, "failed") {
			t.Fatalf("waiting turn %s after the conversation was lost: %+v", id, j)
		}
	}
	f.claimOn(a, at(6*time.Second), "")
	_, err = st.EnqueueTurn(f.ctx, conv.ID, "four", at(7*time.Second))
	wantErr(t, "EnqueueTurn after LoseConversation", err, store.ErrConversationLost)
	if again, err := st.LoseConversation(f.ctx, conv.ID, Lost, at(8*time.Second)); err != nil || again.LostReason != cv.LostReason {
		t.Fatalf("LoseConversation again = %+v, %v; want the same LOST conversation", again, err)
	}
	_, err = st.LoseConversation(f.ctx, "conv_nope", Lost, at(8*time.Second))
	wantErr(t, "LoseConversation of an unknown id", err, store.ErrNotFound)
}

func hasEvent(j wire.Job, typ string) bool {
	for _, e := range j.Events {
		if e.Type == typ {
			return true
		}
	}
	return false
}
