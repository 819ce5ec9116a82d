package storetest

import (
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// interrupt runs an admitted turn of a new conversation at native turn 3
// and ends it without a recorded settlement the way cause says. It returns
// the conversation, the interrupted claim and the queued turn behind it.
func (f *fixture) interrupt(cause string, now time.Time) (wire.Conversation, wire.Claim, wire.Job) {
	f.t.Helper()
	conv := f.conversation()
	f.enqueue(conv.ID, "first")
	first := f.claim(now)
	f.recordContainer(first, "ctr-"+conv.ID, now)
	f.admit(first, now)
	f.settle(first, 3, now)
	f.finish(first, wire.OutcomeSucceeded, now)

	f.enqueue(conv.ID, "interrupted")
	c := f.claim(now)
	if c.Turn.Quarantined {
		f.t.Fatalf("%s: a usable conversation's turn says quarantined", cause)
	}
	f.recordContainer(c, "ctr-"+conv.ID, now)
	f.admit(c, now)
	behind := f.enqueue(conv.ID, "next")
	switch cause {
	case "settlement tries used up":
		if _, err := f.st.Finish(f.ctx, ref(c), wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeFailed, Class: "settlement_failed"}, now); err != nil {
			f.t.Fatal(err)
		}
	case "daemon down past the lease":
		if res, err := f.st.Reap(f.ctx, store.ReapParams{Now: now.Add(TTL + time.Minute), Grace: 10 * time.Second}); err != nil ||
			res.ConversationsQuarantined != 1 {
			f.t.Fatalf("Reap = %+v, %v", res, err)
		}
	case "host gone":
		f.finish(c, wire.OutcomeWorkerLost, now)
	default:
		f.t.Fatalf("unknown cause %q", cause)
	}
	return conv, c, behind
}

var k13Causes = []string{"settlement tries used up", "daemon down past the lease", "host gone"}

// K13: an admitted turn that ends without a recorded settlement quarantines
// its conversation, not LOST: the turn is never queued again, its attempt
// is fenced, the turn behind it runs next and says the conversation is
// quarantined; its container record must carry the exact retained container
// and the recorded boundary or one more, which it records (the
// conversation is usable again, the native turn continues from there), and
// the same resume again is a no-op. Owner-facing words are plain.
func testK13QuarantinedConversationResumes(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	for i, cause := range k13Causes {
		now := at(time.Duration(i) * time.Hour)
		conv, c, behind := f.interrupt(cause, now)
		cv := f.conv(conv.ID)
		if cv.State != wire.ConversationQuarantined || cv.InterruptedJobID != c.JobID || cv.LostReason != "" || cv.NativeTurn != 3 {
			t.Fatalf("%s: conversation = %+v, want quarantined naming %s at native turn 3", cause, cv, c.JobID)
		}
		j := f.job(c.JobID)
		if j.State != wire.JobFailed || len(j.Attempts) != 1 || !strings.Contains(j.Reason, "interrupted") ||
			!strings.Contains(j.Reason, "next message continues") {
			t.Fatalf("%s: interrupted job = %+v", cause, j)
		}
		for _, word := range []string{"lease", "attempt", "settle", "quarantine", "admitted", "worker", c.AttemptID} {
			if strings.Contains(strings.ToLower(j.Reason), word) {
				t.Fatalf("%s: owner-facing %q says %q", cause, j.Reason, word)
			}
		}
		// The old attempt is fenced.
		_, err := st.Settle(f.ctx, ref(c), settlement(c, 4), now.Add(time.Second))
		wantErr(t, cause+": late settlement", err, store.ErrLeaseLost)

		later := now.Add(2 * TTL)
		next := f.claim(later)
		// It names the activation the interrupted turn was admitted under,
		// whose record the supervisor must retain.
		if next.JobID != behind.ID || !next.Turn.Quarantined || next.Turn.ContainerID != "ctr-"+conv.ID || next.Turn.NativeTurn != 3 ||
			next.Turn.InterruptedActivationID != "act-"+c.AttemptID {
			t.Fatalf("%s: next claim = %+v", cause, next)
		}
		// What fails the verification is refused and changes nothing.
		for what, req := range map[string]wire.ContainerRequest{
			"no verified boundary":  {Backend: "docker", ContainerID: "ctr-" + conv.ID},
			"another container":     {Backend: "docker", ContainerID: "ctr-new", Resumed: &wire.ResumedBoundary{NativeTurn: 4}},
			"a boundary two ahead":  {Backend: "docker", ContainerID: "ctr-" + conv.ID, Resumed: &wire.ResumedBoundary{NativeTurn: 5}},
			"a boundary behind":     {Backend: "docker", ContainerID: "ctr-" + conv.ID, Resumed: &wire.ResumedBoundary{NativeTurn: 2}},
			"another backend's box": {Backend: "process", ContainerID: "ctr-" + conv.ID, Resumed: &wire.ResumedBoundary{NativeTurn: 4}},
		} {
			req.AttemptRef = ref(next)
			wantErr(t, cause+": "+what, st.RecordContainer(f.ctx, ref(next), req, later), store.ErrInvalid)
		}
		if cv := f.conv(conv.ID); cv.State != wire.ConversationQuarantined || cv.ContainerID != "ctr-"+conv.ID {
			t.Fatalf("%s: after refused resumes: %+v", cause, cv)
		}
		// The interrupted turn reached the agent: the supervisor is one ahead.
		req := wire.ContainerRequest{AttemptRef: ref(next), Backend: "docker", ContainerID: "ctr-" + conv.ID, Resumed: &wire.ResumedBoundary{NativeTurn: 4}}
		for range 2 {
			if err := st.RecordContainer(f.ctx, ref(next), req, later); err != nil {
				t.Fatalf("%s: resume: %v", cause, err)
			}
		}
		cv = f.conv(conv.ID)
		if cv.State != wire.ConversationUsable || cv.NativeTurn != 4 || cv.InterruptedJobID != "" || cv.Epoch != 1 {
			t.Fatalf("%s: resumed conversation = %+v, want usable at native turn 4, epoch 1", cause, cv)
		}
		if ev := f.events(next.JobID, "conversation_resumed"); len(ev) != 1 || !strings.Contains(string(ev[0].Data), c.JobID) {
			t.Fatalf("%s: conversation_resumed events %+v", cause, ev)
		}
		f.admit(next, later)
		if b := f.settle(next, 5, later); b.NativeTurn != 5 || b.WorkspaceEpoch != 2 {
			t.Fatalf("%s: boundary after resume = %+v", cause, b)
		}
		if r := f.finish(next, wire.OutcomeSucceeded, later); r.ConversationState != wire.ConversationUsable {
			t.Fatalf("%s: finish after resume = %+v", cause, r)
		}
		// Never replayed: the interrupted turn still has its one attempt.
		if j := f.job(c.JobID); len(j.Attempts) != 1 || j.State != wire.JobFailed {
			t.Fatalf("%s: interrupted job afterwards = %+v", cause, j)
		}
	}
	// The interrupted turn never reached the agent: the same boundary resumes too.
	conv, _, _ := f.interrupt("host gone", at(10*time.Hour))
	next := f.claim(at(11 * time.Hour))
	if err := st.RecordContainer(f.ctx, ref(next), wire.ContainerRequest{AttemptRef: ref(next), Backend: "docker",
		ContainerID: "ctr-" + conv.ID, Resumed: &wire.ResumedBoundary{NativeTurn: 3}}, at(11*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if cv := f.conv(conv.ID); cv.State != wire.ConversationUsable || cv.NativeTurn != 3 {
		t.Fatalf("resumed at the same boundary: %+v", cv)
	}
}

// K13: a quarantined conversation whose next turn finds the retained
// sandbox is not the one the interrupted turn left reports it
// unrecoverable: the conversation is LOST with a plain reason, takes no
// new message, and stays LOST (a LOST flag is never cleared).
func testK13UnverifiedQuarantineIsLost(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	for i, cause := range k13Causes {
		now := at(time.Duration(i) * time.Hour)
		conv, c, behind := f.interrupt(cause, now)
		later := now.Add(2 * TTL)
		f.enqueue(conv.ID, "after that")
		next := f.claim(later)
		if next.JobID != behind.ID || !next.Turn.Quarantined {
			t.Fatalf("%s: next claim = %+v", cause, next)
		}
		r, err := st.Finish(f.ctx, ref(next), wire.FinishRequest{AttemptRef: ref(next), Outcome: wire.OutcomeFailed,
			Class: "native_boundary_mismatch", Unrecoverable: true}, later)
		if err != nil || r.ConversationState != wire.ConversationLost || r.JobState != wire.JobFailed {
			t.Fatalf("%s: unrecoverable = %+v, %v", cause, r, err)
		}
		cv := f.conv(conv.ID)
		if cv.State != wire.ConversationLost || !strings.Contains(cv.LostReason, "interrupted") || cv.InterruptedJobID != "" {
			t.Fatalf("%s: conversation = %+v", cause, cv)
		}
		_, err = st.EnqueueTurn(f.ctx, conv.ID, "again?", later)
		wantErr(t, cause+": EnqueueTurn", err, store.ErrConversationLost)
		if _, ok := f.tryClaim(f.host, later); ok {
			t.Fatalf("%s: a turn of the LOST conversation was claimed", cause)
		}
		if j := f.job(c.JobID); len(j.Attempts) != 1 {
			t.Fatalf("%s: interrupted job = %+v", cause, j)
		}
	}
}
