package storetest

import (
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// The basic flow: create host, conversation, enqueue, claim, renew, admit,
// settle, finish.
func testBasicFlow(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	conv := f.conversation()
	j := f.enqueue(conv.ID, "hello")
	if j.State != wire.JobQueued || j.Seq != 1 || j.ConversationID != conv.ID {
		t.Fatalf("enqueued job = %+v", j)
	}
	c := f.claim(at(0))
	if c.JobID != j.ID || c.LeaseGeneration != 1 || c.Turn.Prompt != "hello" || c.Turn.Image != "img:1" ||
		len(c.Turn.AgentCommand) != 2 || !c.LeaseExpiresAt.Equal(at(TTL)) || c.LeaseTTLMS != TTL.Milliseconds() {
		t.Fatalf("claim = %+v", c)
	}
	if _, ok := f.tryClaim(f.host, at(0)); ok {
		t.Fatal("a second claim found a job; there is only one")
	}
	auth, err := st.AuthorizeAttempt(f.ctx, j.ID, Hash(tokenOf(f, c)))
	if err != nil || auth.AttemptID != c.AttemptID || auth.HostID != f.host.ID || auth.JobID != j.ID {
		t.Fatalf("AuthorizeAttempt = %+v, %v", auth, err)
	}
	rr, err := st.Renew(f.ctx, ref(c), TTL, at(30*time.Second))
	if err != nil || !rr.LeaseExpiresAt.Equal(at(30*time.Second+TTL)) || rr.CancelRequested {
		t.Fatalf("Renew = %+v, %v", rr, err)
	}
	if err := st.RecordContainer(f.ctx, ref(c), wire.ContainerRequest{AttemptRef: ref(c), Backend: "docker", ContainerID: "ctr-1"}, at(31*time.Second)); err != nil {
		t.Fatalf("RecordContainer: %v", err)
	}
	er, err := st.AppendEvents(f.ctx, ref(c), []wire.Event{{Seq: 1, Type: "agent.output", Data: []byte(`{"text":"hi"}`)}, {Seq: 2, Type: "agent.output"}}, at(32*time.Second))
	if err != nil || er.StoredThrough != 2 {
		t.Fatalf("AppendEvents = %+v, %v", er, err)
	}
	rc := f.admit(c, at(33*time.Second))
	if rc.JobID != j.ID || rc.ConversationID != conv.ID || rc.ReceiptID == "" || !rc.AdmittedAt.Equal(at(33*time.Second)) {
		t.Fatalf("receipt = %+v", rc)
	}
	b := f.settle(c, 1, at(40*time.Second))
	if b.WorkspaceEpoch != 1 || b.NativeTurn != 1 || b.SnapshotID == "" {
		t.Fatalf("boundary = %+v", b)
	}
	for i := 0; i < 2; i++ {
		if err := st.Notice(f.ctx, ref(c), wire.NoticeRequest{AttemptRef: ref(c), Kind: wire.NoticeSharedWorkspaceSettled, Boundary: b}, at(41*time.Second)); err != nil {
			t.Fatalf("Notice: %v", err)
		}
	}
	if n := len(f.events(j.ID, wire.NoticeSharedWorkspaceSettled)); n != 1 {
		t.Fatalf("%d notice events after the same notice twice, want 1", n)
	}
	fr := f.finish(c, wire.OutcomeSucceeded, at(42*time.Second))
	if fr.JobState != wire.JobSucceeded || fr.ConversationState != wire.ConversationUsable || !fr.RecordedAt.Equal(at(42*time.Second)) {
		t.Fatalf("finish = %+v", fr)
	}
	got := f.job(j.ID)
	if got.State != wire.JobSucceeded || got.Outcome != wire.OutcomeSucceeded || !got.Admitted || got.AttemptCount != 1 ||
		got.EndedAt == nil || len(got.Attempts) != 1 || got.Attempts[0].State != wire.AttemptFinished ||
		got.Attempts[0].ContainerID != "ctr-1" || got.Attempts[0].ActivationID != "act-"+c.AttemptID {
		t.Fatalf("job after finish = %+v", got)
	}
	cv := f.conv(conv.ID)
	if cv.Epoch != 1 || cv.NativeTurn != 1 || cv.ContainerID != "ctr-1" || cv.State != wire.ConversationUsable {
		t.Fatalf("conversation after finish = %+v", cv)
	}
	// The next turn sees the boundary and the container.
	f.enqueue(conv.ID, "again")
	c2 := f.claim(at(time.Minute))
	if c2.Turn.Epoch != 1 || c2.Turn.NativeTurn != 1 || c2.Turn.ContainerID != "ctr-1" || c2.Turn.Seq != 2 {
		t.Fatalf("second claim turn = %+v", c2.Turn)
	}
	list, err := st.ListConversations(f.ctx)
	if err != nil || len(list) != 1 || list[0].ID != conv.ID {
		t.Fatalf("ListConversations = %+v, %v", list, err)
	}
}
