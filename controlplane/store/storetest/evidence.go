package storetest

import (
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// testR30AmbiguousAdmissionNeedsEvidence: a finish that says its
// admission's answer never came is judged on the store's own record of
// the admission, never on the runner's doubt. With no admission recorded
// nothing was admitted, and none can be once the attempt has ended: the
// turn fails as not started and the conversation stays usable, its next
// turn claimable, not quarantined. With an admission recorded the prompt
// may have reached the agent: the conversation is quarantined (K13), not
// lost, and the turn behind it stays queued. Both through Finish and
// through the worker's FinishAs, for failed and cancelled reports.
func testR30AmbiguousAdmissionNeedsEvidence(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	for _, admitted := range []bool{false, true} {
		for _, outcome := range []string{wire.OutcomeFailed, wire.OutcomeCancelled} {
			for _, asWorker := range []bool{false, true} {
				name := map[bool]string{false: "never admitted", true: "admitted"}[admitted] + ", " + outcome +
					map[bool]string{false: ", Finish", true: ", FinishAs"}[asWorker]
				conv := f.conversation()
				j := f.enqueue(conv.ID, "p")
				behind := f.enqueue(conv.ID, "behind")
				c := f.claim(T0)
				if admitted {
					f.admit(c, T0)
				}
				req := wire.FinishRequest{AttemptRef: ref(c), Outcome: outcome, Class: "admission_timeout", Ambiguous: true}
				var r wire.FinishResponse
				var err error
				if asWorker {
					r, err = st.FinishAs(f.ctx, store.Worker{JobID: c.JobID, TokenHash: Hash(tokenOf(f, c))}, ref(c), req, at(time.Second))
				} else {
					r, err = st.Finish(f.ctx, ref(c), req, at(time.Second))
				}
				wantConv := wire.ConversationUsable
				if admitted {
					wantConv = wire.ConversationQuarantined
				}
				wantJob := map[string]string{wire.OutcomeFailed: wire.JobFailed, wire.OutcomeCancelled: wire.JobCancelled}[outcome]
				if err != nil || r.ConversationState != wantConv || r.JobState != wantJob {
					t.Fatalf("%s: finish = %+v, %v; want job %s, conversation %s", name, r, err, wantJob, wantConv)
				}
				cv := f.conv(conv.ID)
				if cv.State != wantConv || cv.LostReason != "" {
					t.Fatalf("%s: conversation = %+v, want %s", name, cv, wantConv)
				}
				if admitted && cv.InterruptedJobID != j.ID {
					t.Fatalf("%s: quarantined conversation names interrupted job %q, want %s", name, cv.InterruptedJobID, j.ID)
				}
				if got := f.job(j.ID); got.State != wantJob || len(got.Attempts) != 1 || got.Reason == "" {
					t.Fatalf("%s: job = %+v", name, got)
				}
				// The same report again: the same answer (P2).
				again, err := st.Finish(f.ctx, ref(c), req, at(2*time.Second))
				if err != nil || again != r {
					t.Fatalf("%s: the same finish again = %+v, %v; want %+v", name, again, err, r)
				}
				if _, err := st.Admit(f.ctx, ref(c), "act-late", at(2*time.Second)); err == nil {
					t.Fatalf("%s: an admission after the finish was accepted", name)
				}
				next := f.claim(at(3 * time.Second))
				if next.JobID != behind.ID || next.Turn.Quarantined != admitted {
					t.Fatalf("%s: next claim = %+v, want %s (quarantined %v)", name, next, behind.ID, admitted)
				}
				f.finish(next, wire.OutcomeFailed, at(4*time.Second))
			}
		}
	}
	if _, ok := f.tryClaim(f.host, at(time.Minute)); ok {
		t.Fatal("a turn was claimed again")
	}
}
