package sqlstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore"
	"github.com/runnerd/runnerd/controlplane/store/storetest"
	"github.com/runnerd/runnerd/wire"
)

// TestPostgresFinishesCoalesce: finishes that arrive while a finish runs
// are recorded by the next one, one pipelined pair for all of them, each
// fenced on its own row and answered on its own. Two sets of the same
// turns (succeeded after settlement, failed and cancelled before
// admission, cancelled after an interrupted settlement (K10), one
// finished twice (P2)) are finished, one through Finish one at a time,
// the other through FinishAs all queued together: every answer, job,
// attempt, event and conversation is the same, and each conversation's
// next turn is its head; a stale generation among the queued is refused
// with its stale report and an unknown token as unauthorized.
func TestPostgresFinishesCoalesce(t *testing.T) {
	sqlstore.PostgresTestDSN(t)
	ctx := context.Background()
	st := sqlstore.OpenTestPostgres(t)
	now, err := st.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h, err := st.CreateHost(ctx, "host-a", storetest.Hash("host-a"), store.Audit{Actor: "test"}, now)
	if err != nil {
		t.Fatal(err)
	}
	const n = 30
	const stale, stranger, k10, twice = 7, 23, 5, 8
	outcome := func(i int) string {
		switch {
		case i == k10:
			return wire.OutcomeCancelled
		case i%3 == 0:
			return wire.OutcomeSucceeded
		case i%3 == 1:
			return wire.OutcomeFailed
		}
		return wire.OutcomeCancelled
	}
	token := func(set, i int) []byte { return storetest.Hash(fmt.Sprint("w", set, "/", i)) }
	var claims [2][n]wire.Claim
	var next [2][n]string
	for set := range 2 {
		for i := range n {
			conv, err := st.CreateConversation(ctx, wire.CreateConversationRequest{AgentCommand: []string{"a"}}, now)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := st.EnqueueTurn(ctx, conv.ID, "first", now); err != nil {
				t.Fatal(err)
			}
			j, err := st.EnqueueTurn(ctx, conv.ID, "next", now)
			if err != nil {
				t.Fatal(err)
			}
			next[set][i] = j.ID
		}
	}
	for set := range 2 {
		for i := range n {
			c, ok, err := st.Claim(ctx, store.ClaimParams{HostID: h.ID, LeaseTTL: time.Minute, WorkerTokenHash: token(set, i), Now: now})
			if err != nil || !ok {
				t.Fatalf("Claim %d/%d = %v, %v", set, i, ok, err)
			}
			claims[set][i] = c
			r := wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}
			if i == k10 {
				if _, err := st.CancelJob(ctx, c.JobID, now); err != nil {
					t.Fatal(err)
				}
			}
			if outcome(i) == wire.OutcomeSucceeded || i == k10 {
				if _, err := st.Admit(ctx, r, "act", now); err != nil {
					t.Fatal(err)
				}
				if _, err := st.Settle(ctx, r, wire.SettlementRequest{AttemptRef: r, ActivationID: "act",
					Supervisor: wire.SupervisorReceipt{ActivationID: "act", ReceiptID: "rcpt", NativeTurn: 2, Interrupted: i == k10}}, now); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	finAt := now.Add(time.Second)
	fin := func(c wire.Claim, i int) (wire.AttemptRef, wire.FinishRequest) {
		r := wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}
		return r, wire.FinishRequest{AttemptRef: r, Outcome: outcome(i), Class: "agent", Reason: fmt.Sprint("turn ", i)}
	}
	var answers [2][n][]wire.FinishResponse
	for i, c := range claims[0] { // one at a time, the ordinary way
		r, req := fin(c, i)
		for range map[bool]int{false: 1, true: 2}[i == twice] {
			resp, err := st.Finish(ctx, r, req, finAt)
			if err != nil {
				t.Fatalf("Finish %d: %v", i, err)
			}
			answers[0][i] = append(answers[0][i], resp)
		}
	}
	queued, release := sqlstore.HoldFinishes(st)
	before, finishedBefore := sqlstore.FinishStatements(st)
	type result struct {
		i    int
		resp wire.FinishResponse
		err  error
	}
	results := make(chan result, n+1)
	var wg sync.WaitGroup
	for i, c := range claims[1] {
		r, req := fin(c, i)
		w := store.Worker{JobID: c.JobID, TokenHash: token(1, i)}
		switch i {
		case stale:
			r.LeaseGeneration++
			req.AttemptRef = r
		case stranger:
			w.TokenHash = storetest.Hash("nobody")
		}
		for range map[bool]int{false: 1, true: 2}[i == twice] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := st.FinishAs(ctx, w, r, req, finAt)
				results <- result{i, resp, err}
			}()
		}
	}
	for queued() < n+1 { // every finish waits behind the held turn
		runtime.Gosched()
	}
	release()
	wg.Wait()
	close(results)
	// All but the stale, the stranger, K10 and the repeat are the pair's.
	after, finished := sqlstore.FinishStatements(st)
	if after-before != 1 || finished-finishedBefore != n-3 {
		t.Errorf("%d finishes queued together took %d coalesced pairs recording %d, want 1 recording %d", n+1, after-before, finished-finishedBefore, n-3)
	}
	for r := range results {
		switch {
		case r.i == stale:
			if !errors.Is(r.err, store.ErrLeaseLost) {
				t.Errorf("the stale finish: %v, want ErrLeaseLost", r.err)
			}
		case r.i == stranger:
			if !errors.Is(r.err, store.ErrUnauthorized) {
				t.Errorf("the unknown token's finish: %v, want ErrUnauthorized", r.err)
			}
		case r.err != nil:
			t.Errorf("finish %d: %v", r.i, r.err)
		default:
			answers[1][r.i] = append(answers[1][r.i], r.resp)
		}
	}
	ids := regexp.MustCompile(`"(job|att|adm|snap|conv)_[a-z0-9]+"`)
	for i := range n {
		if i == stale || i == stranger {
			continue
		}
		var got [2]string
		for set := range 2 {
			c := claims[set][i]
			j, err := st.GetJob(ctx, c.JobID)
			if err != nil {
				t.Fatal(err)
			}
			cv, err := st.GetConversation(ctx, c.Turn.ConversationID)
			if err != nil {
				t.Fatal(err)
			}
			b, err := json.Marshal([]any{answers[set][i], j.State, j.Outcome, j.Reason, j.Attempts, j.Events, cv.State, cv.Epoch})
			if err != nil {
				t.Fatal(err)
			}
			got[set] = ids.ReplaceAllString(string(b), `"$1"`)
		}
		if got[0] != got[1] {
			t.Errorf("turn %d (%s): the coalesced finish differs from Finish:\nFinish    %s\ncoalesced %s", i, outcome(i), got[0], got[1])
		}
	}
	j, err := st.GetJob(ctx, claims[1][stale].JobID)
	if err != nil {
		t.Fatal(err)
	}
	var reports int
	for _, e := range j.Events {
		if e.Type == "lease.stale_report" {
			reports++
		}
	}
	if reports != 1 {
		t.Errorf("the stale finish left %d stale reports, want 1", reports)
	}
	// Each finished conversation's next turn is its head: the claims take
	// exactly those.
	want := map[string]bool{}
	for set := range 2 {
		for i := range n {
			if set == 0 || (i != stale && i != stranger) {
				want[next[set][i]] = true
			}
		}
	}
	for range len(want) {
		c, ok, err := st.Claim(ctx, store.ClaimParams{HostID: h.ID, LeaseTTL: time.Minute, WorkerTokenHash: storetest.Hash(fmt.Sprint("next", len(want))), Now: now.Add(2 * time.Second)})
		if err != nil || !ok {
			t.Fatalf("Claim of a next turn = %v, %v; %d next turns left unclaimed", ok, err, len(want))
		}
		if !want[c.JobID] {
			t.Fatalf("Claim took %s, not a finished conversation's next turn", c.JobID)
		}
		delete(want, c.JobID)
	}
	if c, ok, err := st.Claim(ctx, store.ClaimParams{HostID: h.ID, LeaseTTL: time.Minute, WorkerTokenHash: storetest.Hash("extra"), Now: now.Add(2 * time.Second)}); err != nil || ok {
		t.Fatalf("a claim after the next turns took %s (%v, %v), want none", c.JobID, ok, err)
	}
}

// TestPostgresCoalescedFinishesQuarantineAdmitted: K13 through the
// coalesced finish. Admitted, unsettled turns finishing failed or
// cancelled, queued together into one batch (and one alone, a batch of
// one), are not the batch's to record — they change their conversation —
// and each quarantines its conversation naming its job, fails (with the
// interrupted reason) or is cancelled, and leaves the turn behind it
// queued; none ends with its conversation usable.
func TestPostgresCoalescedFinishesQuarantineAdmitted(t *testing.T) {
	sqlstore.PostgresTestDSN(t)
	ctx := context.Background()
	st := sqlstore.OpenTestPostgres(t)
	now, err := st.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h, err := st.CreateHost(ctx, "host-a", storetest.Hash("host-a"), store.Audit{Actor: "test"}, now)
	if err != nil {
		t.Fatal(err)
	}
	const n = 9 // the last one alone
	token := func(i int) []byte { return storetest.Hash(fmt.Sprint("w", i)) }
	outcome := func(i int) string {
		if i%2 == 0 {
			return wire.OutcomeFailed
		}
		return wire.OutcomeCancelled
	}
	claims := make([]wire.Claim, n)
	behind := make([]string, n)
	for i := range n {
		conv, err := st.CreateConversation(ctx, wire.CreateConversationRequest{AgentCommand: []string{"a"}}, now)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.EnqueueTurn(ctx, conv.ID, "first", now); err != nil {
			t.Fatal(err)
		}
		j, err := st.EnqueueTurn(ctx, conv.ID, "behind", now)
		if err != nil {
			t.Fatal(err)
		}
		behind[i] = j.ID
		c, ok, err := st.Claim(ctx, store.ClaimParams{HostID: h.ID, LeaseTTL: time.Minute, WorkerTokenHash: token(i), Now: now})
		if err != nil || !ok {
			t.Fatalf("Claim %d = %v, %v", i, ok, err)
		}
		claims[i] = c
		r := wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}
		if _, err := st.Admit(ctx, r, "act", now); err != nil {
			t.Fatal(err)
		}
	}
	finish := func(i int) (wire.FinishResponse, error) {
		c := claims[i]
		r := wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}
		return st.FinishAs(ctx, store.Worker{JobID: c.JobID, TokenHash: token(i)}, r,
			wire.FinishRequest{AttemptRef: r, Outcome: outcome(i), Class: "agent_crash"}, now.Add(time.Second))
	}
	queued, release := sqlstore.HoldFinishes(st)
	answers := make([]wire.FinishResponse, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n - 1 {
		wg.Go(func() { answers[i], errs[i] = finish(i) })
	}
	for queued() < n-1 { // every finish waits behind the held lanes: one batch
		runtime.Gosched()
	}
	release()
	wg.Wait()
	answers[n-1], errs[n-1] = finish(n - 1)
	for i, c := range claims {
		wantJob := map[string]string{wire.OutcomeFailed: wire.JobFailed, wire.OutcomeCancelled: wire.JobCancelled}[outcome(i)]
		if errs[i] != nil || answers[i].JobState != wantJob || answers[i].ConversationState != wire.ConversationQuarantined {
			t.Errorf("finish %d (%s, admitted, unsettled) = %+v, %v; want job %s, conversation quarantined", i, outcome(i), answers[i], errs[i], wantJob)
			continue
		}
		cv, err := st.GetConversation(ctx, c.Turn.ConversationID)
		if err != nil {
			t.Fatal(err)
		}
		if cv.State != wire.ConversationQuarantined || cv.InterruptedJobID != c.JobID {
			t.Errorf("conversation of finish %d = %+v, want quarantined by %s", i, cv, c.JobID)
		}
		j, err := st.GetJob(ctx, c.JobID)
		if err != nil {
			t.Fatal(err)
		}
		if j.State != wantJob || j.Reason == "" || (wantJob == wire.JobFailed && !strings.Contains(j.Reason, "interrupted")) {
			t.Errorf("job of finish %d = %s %q, want %s with its reason (a failure: interrupted)", i, j.State, j.Reason, wantJob)
		}
		if b, err := st.GetJob(ctx, behind[i]); err != nil || b.State != wire.JobQueued {
			t.Errorf("the turn behind finish %d = %s, %v; want queued", i, b.State, err)
		}
	}
}
