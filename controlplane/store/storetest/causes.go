package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// S5: a failed or cancelled turn's cause and its evidence are stored
// with the job that the finish ends, through the worker's call
// (FinishAs: on PostgreSQL the path that coalesces finishes) as through
// Finish, and counted by cause; a cause off the closed list, or evidence
// past its bound, is refused as invalid; the reaper names host_lost for
// the job it ends because its host went silent, lease_fenced when the
// host still heartbeats; a success and a job queued again carry none.
func testS5CauseStored(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	now := T0
	// Failed after admission, through the worker's call.
	oom := f.enqueue(f.conversation().ID, "hog")
	c := f.claim(now)
	f.admit(c, now)
	f.settle(c, 1, now)
	const ev = "cgroup v1 memory/memory.oom_control oom_kill 0→1 during the turn; the agent was ended by SIGKILL"
	fin := wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeFailed, Class: "agent_signal_KILL", Cause: wire.CauseOOMKilled, CauseEvidence: ev}
	if _, err := st.FinishAs(f.ctx, store.Worker{JobID: c.JobID, TokenHash: Hash(tokenOf(f, c))}, ref(c), fin, now); err != nil {
		t.Fatalf("FinishAs: %v", err)
	}
	if j := f.job(oom.ID); j.State != wire.JobFailed || j.Cause != wire.CauseOOMKilled || j.CauseEvidence != ev {
		t.Fatalf("job after an OOM kill: %s cause %q (%q); want failed, oom_killed with its evidence", j.State, j.Cause, j.CauseEvidence)
	}

	// Refused: a cause off the list, evidence too long. The attempt is
	// still live after each refusal.
	next := f.enqueue(f.conversation().ID, "exit")
	c = f.claim(now)
	for _, bad := range []wire.FinishRequest{
		{AttemptRef: ref(c), Outcome: wire.OutcomeFailed, Cause: "bogus"},
		{AttemptRef: ref(c), Outcome: wire.OutcomeFailed, Cause: wire.CauseAgentExit, CauseEvidence: string(make([]byte, wire.MaxCauseEvidenceBytes+1))},
	} {
		if _, err := st.Finish(f.ctx, ref(c), bad, now); !errors.Is(err, store.ErrInvalid) {
			t.Fatalf("Finish with cause %q and %d bytes of evidence = %v, want invalid", bad.Cause, len(bad.CauseEvidence), err)
		}
	}
	// Failed before admission, through Finish.
	if _, err := st.Finish(f.ctx, ref(c), wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeCancelled, Class: "cancelled",
		Cause: wire.CauseCancelled, CauseEvidence: "the user's cancel at stage accepted"}, now); err != nil {
		t.Fatalf("Finish: %v", err)
	}
	if j := f.job(next.ID); j.State != wire.JobCancelled || j.Cause != wire.CauseCancelled {
		t.Fatalf("cancelled job: %s cause %q, want cancelled, cancelled", j.State, j.Cause)
	}

	// A success and a requeued job carry no cause, whatever was sent.
	ok := f.enqueue(f.conversation().ID, "fine")
	c = f.claim(now)
	f.admit(c, now)
	f.settle(c, 1, now)
	f.finish(c, wire.OutcomeSucceeded, now)
	requeued := f.enqueue(f.conversation().ID, "host restarts before admission")
	c = f.claim(now)
	if _, err := st.Finish(f.ctx, ref(c), wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeWorkerLost, Class: "worker_lost",
		Cause: wire.CauseDaemonRestart, CauseEvidence: "the restarted daemon found the attempt"}, now); err != nil {
		t.Fatalf("Finish(worker_lost): %v", err)
	}
	for _, id := range []string{ok.ID, requeued.ID} {
		if j := f.job(id); j.Cause != "" || j.CauseEvidence != "" {
			t.Fatalf("job %s (%s) has cause %q (%q), want none", id, j.State, j.Cause, j.CauseEvidence)
		}
	}

	// The reaper: an admitted turn whose host went silent.
	silent := f.enqueue(f.conversation().ID, "host dies")
	var cs wire.Claim
	for range 2 { // the requeued job comes first, then this one
		cs = f.claim(now)
		f.admit(cs, now)
	}
	if cs.JobID != silent.ID {
		t.Fatalf("claimed %s, want %s", cs.JobID, silent.ID)
	}
	if _, err := st.Reap(f.ctx, store.ReapParams{Now: at(TTL + time.Minute), Grace: 10 * time.Second}); err != nil {
		t.Fatalf("Reap: %v", err)
	}
	j := f.job(silent.ID)
	if j.State != wire.JobFailed || j.Cause != wire.CauseHostLost || j.CauseEvidence == "" {
		t.Fatalf("reaped job: %s cause %q (%q); want failed, host_lost with evidence", j.State, j.Cause, j.CauseEvidence)
	}

	// The same with the host heartbeating all along: its renewals did not
	// get through, and the attempt fenced itself — lease_fenced.
	fenced := f.enqueue(f.conversation().ID, "renewals lost")
	now = at(TTL + 2*time.Minute)
	cf := f.claim(now)
	f.admit(cf, now)
	reapAt := now.Add(TTL + time.Minute)
	f.beat(f.host, nil, reapAt.Add(-time.Second))
	if _, err := st.Reap(f.ctx, store.ReapParams{Now: reapAt, Grace: 10 * time.Second}); err != nil {
		t.Fatalf("Reap: %v", err)
	}
	if j := f.job(fenced.ID); cf.JobID != fenced.ID || j.State != wire.JobFailed || j.Cause != wire.CauseLeaseFenced {
		t.Fatalf("reaped job of a heartbeating host: %s cause %q (%q); want failed, lease_fenced", j.State, j.Cause, j.CauseEvidence)
	}

	s, err := st.Stats(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Two host_lost: the requeued job, admitted above on the silent host, ended too.
	want := map[wire.Cause]int{wire.CauseOOMKilled: 1, wire.CauseCancelled: 1, wire.CauseHostLost: 2, wire.CauseLeaseFenced: 1}
	if len(s.JobsByCause) != len(want) {
		t.Fatalf("jobs by cause %v, want %v", s.JobsByCause, want)
	}
	for k, n := range want {
		if s.JobsByCause[k] != n {
			t.Fatalf("jobs by cause %v, want %v", s.JobsByCause, want)
		}
	}
}
