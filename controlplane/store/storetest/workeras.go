package storetest

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// turnAs runs one whole turn through the worker's calls, the ordinary
// ones (as false) or the As ones, each at its own time, and returns the
// answers, as JSON, with the ids that differ from turn to turn written
// as their kinds.
func turnAs(t *testing.T, f *fixture, c wire.Claim, as bool) string {
	t.Helper()
	w := store.Worker{JobID: c.JobID, TokenHash: Hash(tokenOf(f, c))}
	r := ref(c)
	act := "act"
	evs := []wire.Event{{Seq: 1, Type: "progress", Data: json.RawMessage(`{"n":1}`)}, {Seq: 2, Type: "progress", Time: at(time.Second)}}
	settle := wire.SettlementRequest{AttemptRef: r, ActivationID: act,
		Supervisor: wire.SupervisorReceipt{ActivationID: act, ReceiptID: "rcpt", NativeTurn: 4}}
	fin := wire.FinishRequest{AttemptRef: r, Outcome: wire.OutcomeSucceeded}
	var out []any
	add := func(v any, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("as %v: %v", as, err)
		}
		out = append(out, v)
	}
	for range 2 { // the second time, every call is a repeat
		if as {
			add(f.st.AppendEventsAs(f.ctx, w, r, evs, at(2*time.Second)))
			add(f.st.AdmitAs(f.ctx, w, r, act, at(3*time.Second)))
			add(f.st.SettleAs(f.ctx, w, r, settle, at(4*time.Second)))
		} else {
			add(f.st.AppendEvents(f.ctx, r, evs, at(2*time.Second)))
			add(f.st.Admit(f.ctx, r, act, at(3*time.Second)))
			add(f.st.Settle(f.ctx, r, settle, at(4*time.Second)))
		}
	}
	for range 2 {
		if as {
			add(f.st.FinishAs(f.ctx, w, r, fin, at(5*time.Second)))
		} else {
			add(f.st.Finish(f.ctx, r, fin, at(5*time.Second)))
		}
	}
	j := f.job(c.JobID)
	cv := f.conv(c.Turn.ConversationID)
	out = append(out, j.State, j.Outcome, j.Reason, j.Attempts, j.Events, cv.State, cv.Epoch, cv.NativeTurn)
	b, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	ids := regexp.MustCompile(`"(job|att|adm|snap|conv)_[a-z0-9]+"`)
	return ids.ReplaceAllString(string(b), `"$1"`)
}

// testWorkerCallsAs: a turn through AppendEventsAs, AdmitAs, SettleAs and
// FinishAs answers and records exactly what the ordinary calls do (each
// call twice: the repeats too), and the next turn of the conversation is
// its head afterwards.
func testWorkerCallsAs(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	var got [2]string
	for i, as := range []bool{false, true} {
		conv := f.conversation()
		f.enqueue(conv.ID, "first")
		next := f.enqueue(conv.ID, "next")
		got[i] = turnAs(t, f, f.claim(T0), as)
		if c := f.claim(at(6 * time.Second)); c.JobID != next.ID {
			t.Fatalf("as %v: after the finish the claim took %s, want the next turn %s", as, c.JobID, next.ID)
		}
	}
	if got[0] != got[1] {
		t.Fatalf("the As calls differ from the ordinary ones:\nordinary %s\nAs       %s", got[0], got[1])
	}
	// A turn never admitted that fails or is cancelled, twice each.
	for _, outcome := range []string{wire.OutcomeFailed, wire.OutcomeCancelled} {
		for i, as := range []bool{false, true} {
			conv := f.conversation()
			f.enqueue(conv.ID, "first")
			next := f.enqueue(conv.ID, "next")
			c := f.claim(T0)
			w, r := store.Worker{JobID: c.JobID, TokenHash: Hash(tokenOf(f, c))}, ref(c)
			fin := wire.FinishRequest{AttemptRef: r, Outcome: outcome, Class: "agent", Reason: "it <broke>"}
			var out []any
			for range 2 {
				var resp wire.FinishResponse
				var err error
				if as {
					resp, err = st.FinishAs(f.ctx, w, r, fin, at(time.Second))
				} else {
					resp, err = st.Finish(f.ctx, r, fin, at(time.Second))
				}
				if err != nil {
					t.Fatalf("%s, as %v: %v", outcome, as, err)
				}
				out = append(out, resp)
			}
			j, cv := f.job(c.JobID), f.conv(conv.ID)
			out = append(out, j.State, j.Outcome, j.Reason, j.Attempts, j.Events, cv.State)
			b, err := json.Marshal(out)
			if err != nil {
				t.Fatal(err)
			}
			got[i] = regexp.MustCompile(`"(job|att|conv)_[a-z0-9]+"`).ReplaceAllString(string(b), `"$1"`)
			if c := f.claim(at(2 * time.Second)); c.JobID != next.ID {
				t.Fatalf("%s, as %v: after the finish the claim took %s, want the next turn %s", outcome, as, c.JobID, next.ID)
			}
		}
		if got[0] != got[1] {
			t.Fatalf("%s: the As finish differs from the ordinary one:\nordinary %s\nAs       %s", outcome, got[0], got[1])
		}
	}
}

// testWorkerCallsAsRefused: each As call refuses as RenewAs does (an
// unknown token, another job's, an unknown job, another attempt named), a
// refused token leaving no stale report; a stale generation is lease lost
// with its stale report; a finish that needs a settlement it lacks is
// invalid, and changes nothing.
func testWorkerCallsAsRefused(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	conv1, conv2 := f.conversation(), f.conversation()
	j1, j2 := f.enqueue(conv1.ID, "one"), f.enqueue(conv2.ID, "two")
	c1, c2 := f.claim(T0), f.claim(T0)
	w1 := store.Worker{JobID: j1.ID, TokenHash: Hash(tokenOf(f, c1))}
	stale := ref(c1)
	stale.LeaseGeneration++
	calls := map[string]func(w store.Worker, r wire.AttemptRef) error{
		"events": func(w store.Worker, r wire.AttemptRef) error {
			_, err := st.AppendEventsAs(f.ctx, w, r, []wire.Event{{Seq: 1, Type: "x"}}, at(time.Second))
			return err
		},
		"admission": func(w store.Worker, r wire.AttemptRef) error {
			_, err := st.AdmitAs(f.ctx, w, r, "act", at(time.Second))
			return err
		},
		"settlement": func(w store.Worker, r wire.AttemptRef) error {
			_, err := st.SettleAs(f.ctx, w, r, wire.SettlementRequest{AttemptRef: r, ActivationID: "act",
				Supervisor: wire.SupervisorReceipt{ActivationID: "act", ReceiptID: "r"}}, at(time.Second))
			return err
		},
		"finish": func(w store.Worker, r wire.AttemptRef) error {
			_, err := st.FinishAs(f.ctx, w, r, wire.FinishRequest{AttemptRef: r, Outcome: wire.OutcomeSucceeded}, at(time.Second))
			return err
		},
	}
	for _, call := range []string{"events", "admission", "settlement", "finish"} {
		do := calls[call]
		for _, rc := range []struct {
			what string
			w    store.Worker
			ref  wire.AttemptRef
			want error
		}{
			{"unknown token", store.Worker{JobID: j1.ID, TokenHash: Hash("no such token")}, ref(c1), store.ErrUnauthorized},
			{"another job's token", store.Worker{JobID: j2.ID, TokenHash: w1.TokenHash}, ref(c2), store.ErrForbidden},
			{"unknown job", store.Worker{JobID: "job_nope", TokenHash: w1.TokenHash}, ref(c1), store.ErrNotFound},
			{"another attempt named", w1, ref(c2), store.ErrOtherAttempt},
		} {
			wantErr(t, call+", "+rc.what, do(rc.w, rc.ref), rc.want)
		}
		if got := f.events(j1.ID, "lease.stale_report"); len(got) != 0 {
			t.Fatalf("%s: a refused token left %d stale reports, want none", call, len(got))
		}
	}
	// Not admitted: a settlement is refused, a succeeded finish invalid.
	wantErr(t, "settlement before admission", calls["settlement"](w1, ref(c1)), store.ErrNotAdmitted)
	wantErr(t, "succeeded finish before settlement", calls["finish"](w1, ref(c1)), store.ErrInvalid)
	if j := f.job(j1.ID); j.State != wire.JobRunning {
		t.Fatalf("an invalid finish left the job %s, want running", j.State)
	}
	for n, call := range []string{"events", "admission", "settlement", "finish"} {
		wantErr(t, call+", a stale generation", calls[call](w1, stale), store.ErrLeaseLost)
		if got := f.events(j1.ID, "lease.stale_report"); len(got) != n+1 {
			t.Fatalf("%s: a stale generation left %d stale reports in all, want %d", call, len(got), n+1)
		}
	}
}

// testRaceFinishAsVsEnqueue: a turn enqueued while its conversation's
// running turn finishes through FinishAs is claimable afterwards,
// whichever commits first: the finish makes the oldest unfinished turn the
// head after it has ordered itself with the enqueue on the conversation's
// row.
func testRaceFinishAsVsEnqueue(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	for i := range 20 {
		conv := f.conversation()
		f.enqueue(conv.ID, "running")
		c := f.claim(T0)
		w := store.Worker{JobID: c.JobID, TokenHash: Hash(tokenOf(f, c))}
		r := ref(c)
		if _, err := st.AdmitAs(f.ctx, w, r, "act", T0); err != nil {
			t.Fatal(err)
		}
		if _, err := st.SettleAs(f.ctx, w, r, wire.SettlementRequest{AttemptRef: r, ActivationID: "act",
			Supervisor: wire.SupervisorReceipt{ActivationID: "act", ReceiptID: "r"}}, T0); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var next wire.Job
		var ferr, eerr error
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, ferr = st.FinishAs(f.ctx, w, r, wire.FinishRequest{AttemptRef: r, Outcome: wire.OutcomeSucceeded}, at(time.Second))
		}()
		go func() {
			defer wg.Done()
			next, eerr = st.EnqueueTurn(f.ctx, conv.ID, fmt.Sprintf("next %d", i), at(time.Second))
		}()
		wg.Wait()
		if ferr != nil || eerr != nil {
			t.Fatalf("round %d: finish %v, enqueue %v", i, ferr, eerr)
		}
		if got, ok := f.tryClaim(f.host, at(2*time.Second)); !ok || got.JobID != next.ID {
			t.Fatalf("round %d: after the race the claim took %q (%v), want the enqueued turn %s", i, got.JobID, ok, next.ID)
		}
	}
}
