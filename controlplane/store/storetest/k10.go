package storetest

import (
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// interrupted is the settlement of an interrupted boundary (K10).
func interrupted(c wire.Claim, nativeTurn int64) wire.SettlementRequest {
	req := settlement(c, nativeTurn)
	req.Supervisor.Interrupted = true
	return req
}

// K10: the user's cancel of a running, admitted turn settles an
// interrupted boundary: recorded once (R27), only for a job whose cancel
// was requested; the finish "cancelled" ends the job cancelled with a
// plain reason that says the reply was interrupted at the user's request
// (R32), the conversation stays usable at that boundary and its next
// message runs from it; an interrupted turn is never reported succeeded.
// The reaper ends such a turn whose finish was lost the same way (K2).
func testK10InterruptedBoundaryKeepsConversation(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	conv := f.conversation()
	j := f.enqueue(conv.ID, "p")
	c := f.claim(T0)
	f.admit(c, T0)
	now := at(time.Second)
	// Not cancelled: an interrupted boundary is refused, nothing recorded.
	_, err := st.Settle(f.ctx, ref(c), interrupted(c, 1), now)
	wantErr(t, "interrupted settlement without a cancel", err, store.ErrInvalid)
	if _, err := st.CancelJob(f.ctx, j.ID, now); err != nil {
		t.Fatal(err)
	}
	b, err := st.Settle(f.ctx, ref(c), interrupted(c, 1), now)
	if err != nil {
		t.Fatalf("interrupted settlement: %v", err)
	}
	again, err := st.Settle(f.ctx, ref(c), interrupted(c, 1), at(2*time.Second))
	if err != nil || again != b {
		t.Fatalf("repeated interrupted settlement = %+v, %v; want %+v", again, err, b)
	}
	ev := f.events(j.ID, "settled")
	if len(ev) != 1 || !strings.Contains(string(ev[0].Data), `"interrupted":true`) {
		t.Fatalf("settled events %+v, want one that says interrupted", ev)
	}
	_, err = st.Finish(f.ctx, ref(c), wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeSucceeded}, now)
	wantErr(t, "succeeded after an interrupted settlement", err, store.ErrInvalid)
	resp := f.finish(c, wire.OutcomeCancelled, now)
	if resp.JobState != wire.JobCancelled || resp.ConversationState != wire.ConversationUsable {
		t.Fatalf("finish = %+v, want cancelled and usable", resp)
	}
	got := f.job(j.ID)
	if got.State != wire.JobCancelled || got.Outcome != wire.OutcomeCancelled ||
		!strings.Contains(got.Reason, "interrupted at your request") {
		t.Fatalf("job = %s/%s %q, want cancelled, interrupted at the user's request", got.State, got.Outcome, got.Reason)
	}
	for _, word := range []string{"lease", "worker", "host", "supervisor", "no longer available"} {
		if strings.Contains(strings.ToLower(got.Reason), word) {
			t.Fatalf("owner-facing reason %q says %q", got.Reason, word)
		}
	}
	cv := f.conv(conv.ID)
	if cv.State != wire.ConversationUsable || cv.Epoch != b.WorkspaceEpoch || cv.NativeTurn != 1 {
		t.Fatalf("conversation = %+v, want usable at epoch %d native turn 1", cv, b.WorkspaceEpoch)
	}
	next := f.enqueue(conv.ID, "next")
	c2 := f.claim(at(3 * time.Second))
	if c2.JobID != next.ID || c2.Turn.NativeTurn != 1 || c2.Turn.Epoch != b.WorkspaceEpoch {
		t.Fatalf("next claim = %+v, want %s from native turn 1", c2, next.ID)
	}

	// The reaper: interrupted and settled, the finish lost.
	f.admit(c2, at(3*time.Second))
	if _, err := st.CancelJob(f.ctx, next.ID, at(3*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Settle(f.ctx, ref(c2), interrupted(c2, 2), at(4*time.Second)); err != nil {
		t.Fatal(err)
	}
	res, err := st.Reap(f.ctx, store.ReapParams{Now: at(TTL + time.Minute), Grace: 10 * time.Second})
	if err != nil || res.Superseded != 1 || res.ConversationsQuarantined != 0 {
		t.Fatalf("Reap = %+v, %v", res, err)
	}
	if got := f.job(next.ID); got.State != wire.JobCancelled || !strings.Contains(got.Reason, "interrupted at your request") {
		t.Fatalf("reaped interrupted job = %s %q", got.State, got.Reason)
	}
	if cv := f.conv(conv.ID); cv.State != wire.ConversationUsable || cv.NativeTurn != 2 {
		t.Fatalf("conversation after the reaped interrupted turn = %+v", cv)
	}
}
