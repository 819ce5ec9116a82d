package storetest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// A long random sequence of every operation, with the invariants checked
// as it goes: one live attempt per job, generations growing by one, one
// running turn per conversation and that the oldest unfinished, nothing
// runnable in a LOST conversation, counts that match the attempts, and
// every claim taking the oldest runnable job.
func testInvariantsRandomOperations(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	rng := rand.New(rand.NewPCG(2, 6))
	now := T0
	var (
		convs  []string
		jobs   []string // enqueue order
		ended  = map[string]bool{}
		live   = map[string]wire.Claim{} // attempt id → claim
		stale  []wire.AttemptRef
		hosts  = []store.Host{f.host, f.newHost("host-b")}
		counts = map[string]int{}
	)
	var order []string // live attempt ids in claim order, so that runs repeat
	pick := func() (wire.Claim, bool) {
		order = slices.DeleteFunc(order, func(id string) bool { _, ok := live[id]; return !ok })
		if len(order) == 0 {
			return wire.Claim{}, false
		}
		return live[order[rng.IntN(len(order))]], true
	}
	// allowed fails the test unless err is nil or one of the decisions.
	allowed := func(step int, op string, err error, ok ...error) {
		t.Helper()
		if err == nil {
			return
		}
		for _, e := range ok {
			if errors.Is(err, e) {
				return
			}
		}
		t.Fatalf("step %d %s: unexpected error %v", step, op, err)
	}
	// refresh drops attempts that are no longer live from the model.
	refresh := func() {
		for id, c := range live {
			j := f.job(c.JobID)
			if a := j.Attempts[len(j.Attempts)-1]; a.ID != id || a.State != wire.AttemptRunning {
				delete(live, id)
				stale = append(stale, ref(c))
			}
		}
	}
	for step := 0; step < 400; step++ {
		op := rng.IntN(100)
		switch {
		case op < 5 || len(convs) == 0:
			convs = append(convs, f.conversation().ID)
		case op < 20:
			conv := convs[rng.IntN(len(convs))]
			j, err := st.EnqueueTurn(f.ctx, conv, fmt.Sprintf("turn %d", step), now)
			allowed(step, "enqueue", err, store.ErrConversationLost)
			if err == nil {
				jobs = append(jobs, j.ID)
			}
		case op < 35:
			want := oldestRunnable(f, jobs, ended, now)
			c, ok := f.tryClaim(hosts[rng.IntN(len(hosts))], now)
			switch {
			case ok && c.JobID != want:
				for _, id := range jobs {
					j := f.job(id)
					t.Logf("%s conv %s seq %d state %s ended-in-model %v attempts %d", id, j.ConversationID, j.Seq, j.State, ended[id], len(j.Attempts))
				}
				t.Fatalf("step %d: claimed %s, want the oldest runnable %q", step, c.JobID, want)
			case !ok && want != "":
				t.Fatalf("step %d: no claim, but %s was runnable", step, want)
			case ok:
				live[c.AttemptID] = c
				order = append(order, c.AttemptID)
				counts[c.JobID]++
			}
		case op < 42:
			if c, ok := pick(); ok {
				_, err := st.Renew(f.ctx, ref(c), TTL, now)
				allowed(step, "renew", err, store.ErrLeaseLost)
			}
		case op < 48:
			if c, ok := pick(); ok {
				_, err := st.Admit(f.ctx, ref(c), "act", now)
				allowed(step, "admit", err, store.ErrLeaseLost)
			}
		case op < 52:
			if c, ok := pick(); ok {
				_, err := st.Settle(f.ctx, ref(c), wire.SettlementRequest{AttemptRef: ref(c), ActivationID: "act",
					Supervisor: wire.SupervisorReceipt{ActivationID: "act", NativeTurn: int64(step)}}, now)
				allowed(step, "settle", err, store.ErrLeaseLost, store.ErrNotAdmitted)
			}
		case op < 58:
			// A whole healthy turn: admission, settlement, success.
			if c, ok := pick(); ok {
				_, err := st.Admit(f.ctx, ref(c), "act", now)
				if err == nil {
					_, err = st.Settle(f.ctx, ref(c), wire.SettlementRequest{AttemptRef: ref(c), ActivationID: "act",
						Supervisor: wire.SupervisorReceipt{ActivationID: "act", NativeTurn: int64(step)}}, now)
				}
				if err == nil {
					_, err = st.Finish(f.ctx, ref(c), wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeSucceeded}, now)
				}
				allowed(step, "whole turn", err, store.ErrLeaseLost)
			}
		case op < 68:
			if c, ok := pick(); ok {
				outcome := []string{wire.OutcomeSucceeded, wire.OutcomeSucceeded, wire.OutcomeSucceeded,
					wire.OutcomeFailed, wire.OutcomeCancelled, wire.OutcomeWorkerLost, wire.OutcomeWorkerLost}[rng.IntN(7)]
				req := wire.FinishRequest{AttemptRef: ref(c), Outcome: outcome}
				// R31, K13: every other failure finds the retained session
				// is not the settled one.
				req.Unrecoverable = outcome == wire.OutcomeFailed && step%2 == 0
				_, err := st.Finish(f.ctx, ref(c), req, now)
				allowed(step, "finish "+outcome, err, store.ErrLeaseLost, store.ErrInvalid)
			}
		case op < 73:
			if c, ok := pick(); ok {
				err := st.Release(f.ctx, ref(c), wire.ReleaseRequest{AttemptRef: ref(c), Class: "spawn_failed"}, now)
				allowed(step, "release", err, store.ErrLeaseLost, store.ErrAdmitted)
			}
		case op < 77:
			if c, ok := pick(); ok {
				_, err := st.Abandon(f.ctx, ref(c), wire.AbandonRequest{AttemptRef: ref(c), Class: "preflight"}, now)
				allowed(step, "abandon", err, store.ErrLeaseLost, store.ErrAdmitted)
			}
		case op < 81:
			if len(jobs) > 0 {
				_, err := st.CancelJob(f.ctx, jobs[rng.IntN(len(jobs))], now)
				allowed(step, "cancel", err, store.ErrGone)
			}
		case op < 85:
			_, err := st.Reap(f.ctx, store.ReapParams{Now: now, Grace: 10 * time.Second, MaxWorkerLost: 2})
			allowed(step, "reap", err)
		case op < 87:
			_, err := st.ResumeAfterAbsence(f.ctx, now, 5*time.Minute)
			allowed(step, "resume", err)
		case op < 91:
			if len(stale) > 0 {
				r := stale[rng.IntN(len(stale))]
				_, err := st.Renew(f.ctx, r, TTL, now)
				if !errors.Is(err, store.ErrLeaseLost) {
					t.Fatalf("step %d: stale renew of %+v = %v", step, r, err)
				}
			}
		default:
			now = now.Add(time.Duration(rng.IntN(240)) * time.Second)
		}
		refresh()
		if step%10 == 9 || step == 399 {
			checkInvariants(t, f, convs, jobs, ended, counts)
		}
	}
	states := map[string]int{}
	attempts := map[string]int{}
	for _, id := range jobs {
		j := f.job(id)
		states[j.State]++
		for _, a := range j.Attempts {
			attempts[a.State]++
		}
	}
	lostConvs, quarantinedConvs := 0, 0
	for _, id := range convs {
		switch f.conv(id).State {
		case wire.ConversationLost:
			lostConvs++
		case wire.ConversationQuarantined:
			quarantinedConvs++
		}
	}
	t.Logf("%d conversations (%d lost, %d quarantined), jobs by state %v, attempts by state %v", len(convs), lostConvs, quarantinedConvs, states, attempts)
	// The sequence must have reached every kind of ending, or it proves little.
	for _, st := range []string{wire.AttemptFinished, wire.AttemptReleased, wire.AttemptAbandoned, wire.AttemptSuperseded, wire.AttemptWorkerLost} {
		if attempts[st] == 0 {
			t.Errorf("no attempt ended %s", st)
		}
	}
	if states[wire.JobSucceeded] == 0 || states[wire.JobCancelled] == 0 || lostConvs == 0 || quarantinedConvs == 0 {
		t.Errorf("the sequence missed an ending: jobs %v, %d lost and %d quarantined conversations", states, lostConvs, quarantinedConvs)
	}
}

// oldestRunnable is the job Claim must take: the first queued job, in
// enqueue order, whose conversation has no earlier unfinished turn and
// which is past its release backoff (K7).
func oldestRunnable(f *fixture, jobs []string, ended map[string]bool, now time.Time) string {
	busy := map[string]bool{}
	for _, id := range jobs {
		if ended[id] {
			continue
		}
		j := f.job(id)
		switch {
		case j.State != wire.JobQueued && j.State != wire.JobRunning:
			ended[id] = true
		case j.State == wire.JobQueued && !busy[j.ConversationID] && (j.NotBefore == nil || !j.NotBefore.After(now)):
			return id // a job in its release backoff (K7) holds its conversation, nobody else's
		default:
			busy[j.ConversationID] = true
		}
	}
	return ""
}

func checkInvariants(t *testing.T, f *fixture, convs, jobs []string, ended map[string]bool, claims map[string]int) {
	t.Helper()
	lost := map[string]bool{}
	for _, id := range convs {
		if f.conv(id).State == wire.ConversationLost {
			lost[id] = true
		}
	}
	running := map[string]string{} // conversation → running job
	unfinishedBefore := map[string]bool{}
	for _, id := range jobs {
		j := f.job(id)
		live := 0
		counted := 0
		for i, a := range j.Attempts {
			if a.Generation != int64(i+1) {
				t.Fatalf("job %s attempt %d has generation %d", id, i, a.Generation)
			}
			if a.State == wire.AttemptRunning {
				live++
			}
			if a.CountsAsAttempt {
				counted++
			}
			if a.State != wire.AttemptRunning && a.EndedAt == nil {
				t.Fatalf("job %s: ended attempt without ended_at: %+v", id, a)
			}
		}
		if len(j.Attempts) != claims[id] {
			t.Fatalf("job %s has %d attempts, %d claims", id, len(j.Attempts), claims[id])
		}
		if counted != j.AttemptCount {
			t.Fatalf("job %s: attempt_count %d, %d counted attempts", id, j.AttemptCount, counted)
		}
		switch j.State {
		case wire.JobRunning:
			if live != 1 {
				t.Fatalf("running job %s has %d live attempts", id, live)
			}
			if other, ok := running[j.ConversationID]; ok {
				t.Fatalf("jobs %s and %s of one conversation run at once", other, id)
			}
			if unfinishedBefore[j.ConversationID] {
				t.Fatalf("job %s runs before an earlier turn of its conversation ended", id)
			}
			running[j.ConversationID] = id
		case wire.JobQueued:
			if live != 0 {
				t.Fatalf("queued job %s has a live attempt", id)
			}
		default:
			if live != 0 || j.EndedAt == nil {
				t.Fatalf("ended job %s: %d live attempts, ended_at %v", id, live, j.EndedAt)
			}
			ended[id] = true
		}
		if (j.State == wire.JobQueued || j.State == wire.JobRunning) && lost[j.ConversationID] {
			t.Fatalf("job %s is %s in a LOST conversation", id, j.State)
		}
		if j.State == wire.JobQueued || j.State == wire.JobRunning {
			unfinishedBefore[j.ConversationID] = true
		}
	}
}
