package storetest

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// S3: a conversation is deleted only while no turn of it runs or waits;
// then it is deleted for good: it takes no new message, the host's
// question about it answers "deleted" (the positive answer that removes
// its sandbox, K8), an operator's lose leaves it deleted, and retention
// reclaims its turns' detail like any ended turn's (P8).
func testS3DeleteConversation(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	conv := f.conversation()
	other := f.conversation()
	f.enqueue(conv.ID, "one secret")
	c1 := f.claim(at(0))
	f.recordContainer(c1, "ctr-1", at(time.Second))
	f.admit(c1, at(time.Second))
	f.settle(c1, 1, at(time.Second))
	f.finish(c1, wire.OutcomeSucceeded, at(time.Second))

	// A waiting turn refuses, then a running one; nothing changes.
	t2 := f.enqueue(conv.ID, "two")
	_, err := st.DeleteConversation(f.ctx, conv.ID, at(2*time.Second))
	wantErr(t, "DeleteConversation while a turn waits", err, store.ErrConversationBusy)
	c2 := f.claim(at(3 * time.Second))
	if c2.JobID != t2.ID {
		t.Fatalf("claimed %s, want %s", c2.JobID, t2.ID)
	}
	_, err = st.DeleteConversation(f.ctx, conv.ID, at(4*time.Second))
	wantErr(t, "DeleteConversation while a turn runs", err, store.ErrConversationBusy)
	if cv := f.conv(conv.ID); cv.State != wire.ConversationUsable {
		t.Fatalf("refused delete left the conversation %s", cv.State)
	}
	f.admit(c2, at(5*time.Second))
	f.settle(c2, 2, at(5*time.Second))
	f.finish(c2, wire.OutcomeSucceeded, at(5*time.Second))

	cv, err := st.DeleteConversation(f.ctx, conv.ID, at(6*time.Second))
	if err != nil || cv.State != wire.ConversationDeleted || cv.ID != conv.ID {
		t.Fatalf("DeleteConversation = %+v, %v; want it deleted", cv, err)
	}
	if again, err := st.DeleteConversation(f.ctx, conv.ID, at(7*time.Second)); err != nil || again.State != wire.ConversationDeleted {
		t.Fatalf("DeleteConversation again = %+v, %v; want the same deleted conversation", again, err)
	}
	_, err = st.EnqueueTurn(f.ctx, conv.ID, "three", at(8*time.Second))
	wantErr(t, "EnqueueTurn on a deleted conversation", err, store.ErrConversationDeleted)
	if lost, err := st.LoseConversation(f.ctx, conv.ID, Lost, at(9*time.Second)); err != nil || lost.State != wire.ConversationDeleted {
		t.Fatalf("LoseConversation of a deleted conversation = %+v, %v; want it left deleted", lost, err)
	}
	states, err := st.ConversationStates(f.ctx, []string{conv.ID, other.ID})
	if err != nil {
		t.Fatal(err)
	}
	if got := states[conv.ID]; got.State != wire.ConversationDeleted || got.SandboxHostID != f.host.ID {
		t.Fatalf("ConversationStates(deleted) = %+v; want deleted, recorded on %s", got, f.host.ID)
	}
	if got := states[other.ID]; got.State != wire.ConversationUsable {
		t.Fatalf("ConversationStates(other) = %+v; deleting one conversation touched another", got)
	}
	if c, ok := f.tryClaim(f.host, at(10*time.Second)); ok {
		t.Fatalf("claimed %s of a deleted conversation", c.JobID)
	}
	_, err = st.DeleteConversation(f.ctx, "conv_nope", at(10*time.Second))
	wantErr(t, "DeleteConversation of an unknown id", err, store.ErrNotFound)

	// P8 reclaims the deleted conversation's turns past the window.
	if _, err := st.ReclaimDetail(f.ctx, store.ReclaimParams{Now: at(31 * 24 * time.Hour), Before: at(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{c1.JobID, c2.JobID} {
		if j := f.job(id); j.Prompt != "" || j.DetailReclaimedAt == nil {
			t.Fatalf("turn %s of the deleted conversation after retention: prompt %q, reclaimed at %v", id, j.Prompt, j.DetailReclaimedAt)
		}
	}
}

// S3 under concurrency: a delete racing an enqueue of the same
// conversation is decided one way or the other, never both — the enqueue
// wins and the delete is refused (a turn waits), or the delete wins and
// the enqueue is refused (deleted). A deleted conversation never holds a
// waiting turn.
func testRaceDeleteVsEnqueue(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	const n = 20
	convs := make([]wire.Conversation, n)
	for i := range convs {
		convs[i] = f.conversation()
	}
	type result struct{ delErr, enqErr error }
	results := make([]result, n)
	var wg sync.WaitGroup
	for i, cv := range convs {
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, results[i].delErr = st.DeleteConversation(f.ctx, cv.ID, at(time.Second))
		}()
		go func() {
			defer wg.Done()
			_, results[i].enqErr = st.EnqueueTurn(f.ctx, cv.ID, "hello", at(time.Second))
		}()
	}
	wg.Wait()
	for i, r := range results {
		state := f.conv(convs[i].ID).State
		switch {
		case r.delErr == nil && errors.Is(r.enqErr, store.ErrConversationDeleted):
			if state != wire.ConversationDeleted {
				t.Errorf("%s: delete won, state %s", convs[i].ID, state)
			}
		case r.enqErr == nil && errors.Is(r.delErr, store.ErrConversationBusy):
			if state != wire.ConversationUsable {
				t.Errorf("%s: enqueue won, state %s", convs[i].ID, state)
			}
		default:
			t.Errorf("%s: delete %v, enqueue %v (state %s); want exactly one to win", convs[i].ID, r.delErr, r.enqErr, state)
		}
	}
}
