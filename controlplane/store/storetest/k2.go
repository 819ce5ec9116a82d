package storetest

import (
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// K2: a turn whose settlement was recorded, whose finish never arrived
// and whose host is gone: the reaper ends the job as succeeded with the
// explicit outcome report_missing and a plain reason (R32), the
// conversation stays usable at the recorded boundary, and a new message
// runs from it.
func testK2SettledFinishLostKeepsConversation(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	conv := f.conversation()
	j := f.enqueue(conv.ID, "p")
	c := f.claim(T0)
	f.admit(c, T0)
	b := f.settle(c, 7, at(time.Second))
	// The daemon is killed before its finish; nothing more arrives.
	res, err := st.Reap(f.ctx, store.ReapParams{Now: at(TTL + time.Minute), Grace: 10 * time.Second})
	if err != nil || res != (store.ReapResult{Superseded: 1, ReportsMissing: 1}) {
		t.Fatalf("Reap = %+v, %v; want one superseded attempt whose report is missing", res, err)
	}
	got := f.job(j.ID)
	if got.State != wire.JobSucceeded || got.Outcome != wire.OutcomeReportMissing {
		t.Fatalf("job = %s/%s, want %s/%s", got.State, got.Outcome, wire.JobSucceeded, wire.OutcomeReportMissing)
	}
	for _, word := range []string{"interrupted", "no longer available", "lease", "worker", "host", "report_missing"} {
		if strings.Contains(strings.ToLower(got.Reason), word) {
			t.Fatalf("owner-facing reason %q says %q", got.Reason, word)
		}
	}
	if a := got.Attempts[0]; a.State != wire.AttemptSuperseded || a.Outcome != wire.OutcomeReportMissing || !a.CountsAsAttempt ||
		got.AttemptCount != 1 || got.WorkerLostCount != 0 {
		t.Fatalf("attempt %+v, counts %d/%d: want one counted attempt that settled", a, got.AttemptCount, got.WorkerLostCount)
	}
	cv := f.conv(conv.ID)
	if cv.State != wire.ConversationUsable || cv.Epoch != b.WorkspaceEpoch || cv.NativeTurn != 7 {
		t.Fatalf("conversation = %+v, want usable at epoch %d native turn 7", cv, b.WorkspaceEpoch)
	}
	// The next message runs from the recorded boundary.
	next := f.enqueue(conv.ID, "next")
	c2 := f.claim(at(TTL + 2*time.Minute))
	if c2.JobID != next.ID || c2.Turn.Epoch != b.WorkspaceEpoch || c2.Turn.NativeTurn != 7 {
		t.Fatalf("next claim = %+v, want %s from epoch %d native turn 7", c2, next.ID, b.WorkspaceEpoch)
	}
	now := at(TTL + 2*time.Minute)
	f.admit(c2, now)
	f.settle(c2, 8, now)
	f.finish(c2, wire.OutcomeSucceeded, now)
	if got := f.job(next.ID); got.State != wire.JobSucceeded {
		t.Fatalf("next job = %+v", got)
	}
	// The old runner's late finish is refused, as any stale report.
	_, err = st.Finish(f.ctx, ref(c), wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeSucceeded}, now)
	wantErr(t, "late finish", err, store.ErrLeaseLost)
	// A runner can never report the outcome itself.
	_, err = st.Finish(f.ctx, ref(c2), wire.FinishRequest{AttemptRef: ref(c2), Outcome: wire.OutcomeReportMissing}, now)
	wantErr(t, "finish with report_missing", err, store.ErrInvalid)
}

// P6: a host lost after admission and before settlement — found by the
// reaper, or reported by the restarted daemon as worker_lost — is counted
// as a worker lost, not as an attempt of the job, while the conversation
// is quarantined (K13; R30, R35: never replayed).
func testP6AdmittedHostLossCounted(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	for _, byReaper := range []bool{true, false} {
		conv := f.conversation()
		j := f.enqueue(conv.ID, "p")
		c := f.claim(T0)
		f.admit(c, T0)
		if byReaper {
			if res, err := st.Reap(f.ctx, store.ReapParams{Now: at(TTL + time.Minute), Grace: 10 * time.Second}); err != nil ||
				res != (store.ReapResult{Superseded: 1, ConversationsQuarantined: 1}) {
				t.Fatalf("Reap = %+v, %v", res, err)
			}
		} else {
			f.finish(c, wire.OutcomeWorkerLost, at(time.Second))
		}
		got := f.job(j.ID)
		a := got.Attempts[0]
		if got.State != wire.JobFailed || got.WorkerLostCount != 1 || got.AttemptCount != 0 || a.CountsAsAttempt {
			t.Fatalf("reaper %v: job %s, worker_lost_count %d, attempt_count %d, attempt counted %v; want failed, 1, 0, false",
				byReaper, got.State, got.WorkerLostCount, got.AttemptCount, a.CountsAsAttempt)
		}
		if cv := f.conv(conv.ID); cv.State != wire.ConversationQuarantined {
			t.Fatalf("reaper %v: conversation = %+v", byReaper, cv)
		}
	}
}
