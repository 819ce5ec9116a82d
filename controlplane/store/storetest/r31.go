package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// R31: a turn that finds the retained session gone (its workspace vanished,
// or the sandbox's native turn is not the settled boundary) reports it
// unrecoverable before admission; the conversation becomes LOST with a plain
// reason instead of failing every later turn the same way, and a plain
// failure before admission leaves the conversation usable.
func testR31UnrecoverableSessionLosesConversation(t *testing.T, st store.Store) {
	f := newFixture(t, st)

	plain := f.conversation()
	f.enqueue(plain.ID, "p")
	c := f.claim(T0)
	req := wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeFailed, Class: "sandbox_unavailable"}
	if r, err := st.Finish(f.ctx, ref(c), req, at(time.Second)); err != nil || r.ConversationState != wire.ConversationUsable {
		t.Fatalf("plain failure before admission: %+v, %v", r, err)
	}

	gone := f.conversation()
	j := f.enqueue(gone.ID, "p")
	c = f.claim(at(2 * time.Second))
	req = wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeFailed, Class: "native_boundary_mismatch", Unrecoverable: true}
	r, err := st.Finish(f.ctx, ref(c), req, at(3*time.Second))
	if err != nil || r.JobState != wire.JobFailed || r.ConversationState != wire.ConversationLost {
		t.Fatalf("unrecoverable: %+v, %v", r, err)
	}
	// The same report again gets the same answer (P2); a different one is stale.
	if r2, err := st.Finish(f.ctx, ref(c), req, at(4*time.Second)); err != nil || r2 != r {
		t.Fatalf("repeat: %+v, %v; first %+v", r2, err, r)
	}
	conv, err := st.GetConversation(f.ctx, gone.ID)
	if err != nil || conv.State != wire.ConversationLost || conv.LostReason == "" {
		t.Fatalf("conversation = %+v, %v", conv, err)
	}
	if _, err := st.EnqueueTurn(f.ctx, gone.ID, "again", at(5*time.Second)); !errors.Is(err, store.ErrConversationLost) {
		t.Fatalf("message to the lost conversation: %v", err)
	}
	if got := f.job(j.ID); got.State != wire.JobFailed {
		t.Fatalf("job = %+v", got)
	}
}
