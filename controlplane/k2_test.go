package controlplane_test

import (
	"context"
	"testing"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/wire"
)

// K2 through the server, on both stores: a turn settled at the control
// plane whose daemon was killed before its finish, host gone. The reaper
// ends the job as succeeded with outcome report_missing, the conversation
// stays usable at the recorded boundary, and a new message runs from it.
func TestK2SettledFinishLostConversationUsable(t *testing.T) {
	onEachDatabase(t, func(t *testing.T, db database) {
		f := newFixtureOn(t, db)
		ctx := context.Background()
		conv := f.newConversation()
		job := f.send(conv.ID, "hello")
		c := f.claim()
		r := ref(c)
		if _, err := f.wc.Admission(ctx, c.WorkerToken, c.JobID, wire.AdmissionRequest{AttemptRef: r, ActivationID: "act-1"}); err != nil {
			t.Fatal(err)
		}
		bd, err := f.wc.Settlement(ctx, c.WorkerToken, c.JobID, wire.SettlementRequest{AttemptRef: r, ActivationID: "act-1",
			Supervisor: wire.SupervisorReceipt{ActivationID: "act-1", ReceiptID: "sr-1", NativeTurn: 1}})
		if err != nil {
			t.Fatal(err)
		}
		// Killed: no finish, no renewal. The reaper sweeps as it should.
		for d := controlplane.DefaultReaperInterval; d <= controlplane.DefaultLeaseTTL+controlplane.DefaultReaperGrace+controlplane.DefaultReaperInterval; d += controlplane.DefaultReaperInterval {
			f.clock.Advance(controlplane.DefaultReaperInterval)
			f.srv.Sweep(ctx)
		}
		j := f.job(job.ID)
		if j.State != wire.JobSucceeded || j.Outcome != wire.OutcomeReportMissing || j.Reason == "" {
			t.Fatalf("job after the lost finish = %s/%s %q, want succeeded/report_missing with a reason", j.State, j.Outcome, j.Reason)
		}
		var cv wire.Conversation
		f.user("GET", "/v1/conversations/"+conv.ID, nil, &cv)
		if cv.State != wire.ConversationUsable || cv.Epoch != bd.WorkspaceEpoch || cv.NativeTurn != 1 {
			t.Fatalf("conversation = %+v, want usable at the recorded boundary", cv)
		}
		next := f.send(conv.ID, "and then?")
		c2 := f.claim()
		if c2.JobID != next.ID || c2.Turn.Epoch != bd.WorkspaceEpoch || c2.Turn.NativeTurn != 1 {
			t.Fatalf("next claim = %+v, want job %s from the recorded boundary", c2, next.ID)
		}
		if _, err := f.wc.Finish(ctx, c2.WorkerToken, c2.JobID, wire.FinishRequest{AttemptRef: ref(c2), Outcome: wire.OutcomeFailed, Class: "x"}); err != nil {
			t.Fatal(err)
		}
		if cv2 := f.job(next.ID); cv2.State != wire.JobFailed {
			t.Fatalf("next job = %+v", cv2)
		}
	})
}
