package storetest

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// Many goroutines claim at once: each job is claimed exactly once, and
// the turns of one conversation still run one at a time, in order.
func testRaceManyClaimers(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	const convs, turns, workers = 40, 3, 8
	seqOf := map[string]int64{}
	convOf := map[string]string{}
	for i := 0; i < convs; i++ {
		c := f.conversation()
		for k := 0; k < turns; k++ {
			j := f.enqueue(c.ID, fmt.Sprintf("turn %d", k+1))
			seqOf[j.ID], convOf[j.ID] = j.Seq, c.ID
		}
	}
	var (
		mu      sync.Mutex
		claimed = map[string]int{}
		order   = map[string][]int64{} // conversation → seqs in claim order
		running = map[string]bool{}    // conversation → a turn is running
		errs    []error
		done    atomic.Int64
		tokens  atomic.Int64
		wg      sync.WaitGroup
	)
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for done.Load() < convs*turns {
				c, ok, err := st.Claim(f.ctx, store.ClaimParams{HostID: f.host.ID, LeaseTTL: TTL,
					WorkerTokenHash: Hash(fmt.Sprintf("race-%d", tokens.Add(1))), Now: T0})
				if err != nil {
					fail(err)
					return
				}
				if !ok {
					runtime.Gosched()
					continue
				}
				conv := convOf[c.JobID]
				mu.Lock()
				claimed[c.JobID]++
				order[conv] = append(order[conv], seqOf[c.JobID])
				if running[conv] {
					errs = append(errs, fmt.Errorf("two turns of %s ran at once", conv))
				}
				running[conv] = true
				mu.Unlock()
				if _, err := st.Admit(f.ctx, ref(c), "act", T0); err != nil {
					fail(err)
					return
				}
				if _, err := st.Settle(f.ctx, ref(c), wire.SettlementRequest{AttemptRef: ref(c), ActivationID: "act",
					Supervisor: wire.SupervisorReceipt{ActivationID: "act", NativeTurn: c.Turn.Seq}}, T0); err != nil {
					fail(err)
					return
				}
				mu.Lock()
				running[conv] = false
				mu.Unlock()
				if _, err := st.Finish(f.ctx, ref(c), wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeSucceeded}, T0); err != nil {
					fail(err)
					return
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("errors: %v", errs)
	}
	if len(claimed) != convs*turns {
		t.Fatalf("%d jobs claimed, want %d", len(claimed), convs*turns)
	}
	for id, n := range claimed {
		if n != 1 {
			t.Fatalf("job %s claimed %d times", id, n)
		}
	}
	for conv, seqs := range order {
		for i, s := range seqs {
			if s != int64(i+1) {
				t.Fatalf("conversation %s ran turns in order %v", conv, seqs)
			}
		}
		if cv := f.conv(conv); cv.Epoch != turns || cv.NativeTurn != turns {
			t.Fatalf("conversation %s = epoch %d native turn %d", conv, cv.Epoch, cv.NativeTurn)
		}
	}
}

// Writes carrying an ended lease race the job's next claim: every one is
// refused, and the new attempt is untouched.
func testRaceStaleWritesVsNewClaim(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	const rounds, writers = 12, 4
	for r := 0; r < rounds; r++ {
		base := at(time.Duration(r) * time.Hour)
		conv := f.conversation()
		j := f.enqueue(conv.ID, "p")
		c1 := f.claim(base)
		if r%2 == 0 {
			if err := st.Release(f.ctx, ref(c1), wire.ReleaseRequest{AttemptRef: ref(c1), Class: "spawn_failed"}, base); err != nil {
				t.Fatal(err)
			}
		} else if res, err := st.Reap(f.ctx, store.ReapParams{Now: base.Add(TTL + time.Minute), Grace: time.Second}); err != nil || res.Superseded != 1 {
			t.Fatalf("Reap = %+v, %v", res, err)
		}
		// The stale writer's clock says its lease is still valid: only the
		// generation and the attempt state can stop it.
		staleNow := base.Add(time.Second)
		var wg sync.WaitGroup
		var c2 wire.Claim
		var claimErr error
		results := make(chan error, writers*10)
		start := make(chan struct{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			var ok bool
			c2, ok, claimErr = st.Claim(f.ctx, store.ClaimParams{HostID: f.host.ID, LeaseTTL: TTL,
				WorkerTokenHash: Hash(fmt.Sprintf("stale-race-%d", r)), Now: base.Add(TTL + 2*time.Minute)})
			if claimErr == nil && !ok {
				claimErr = errors.New("no job to claim")
			}
		}()
		for w := 0; w < writers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for _, op := range attemptOps(st, f, ref(c1), staleNow) {
					results <- op.call()
				}
			}()
		}
		close(start)
		wg.Wait()
		close(results)
		if claimErr != nil {
			t.Fatalf("round %d: claim: %v", r, claimErr)
		}
		for err := range results {
			if !errors.Is(err, store.ErrLeaseLost) {
				t.Fatalf("round %d: a stale write got %v, want ErrLeaseLost", r, err)
			}
		}
		// The old generation on the new attempt's id is refused too.
		for _, op := range attemptOps(st, f, wire.AttemptRef{AttemptID: c2.AttemptID, LeaseGeneration: c1.LeaseGeneration}, base.Add(TTL+2*time.Minute)) {
			wantErr(t, op.name+" with the old generation", op.call(), store.ErrLeaseLost)
		}
		got := f.job(j.ID)
		live := got.Attempts[len(got.Attempts)-1]
		if c2.JobID != j.ID || c2.LeaseGeneration != 2 || got.State != wire.JobRunning || got.Admitted || live.ID != c2.AttemptID ||
			live.State != wire.AttemptRunning || live.ContainerID != "" || !live.LeaseExpiresAt.Equal(c2.LeaseExpiresAt) {
			t.Fatalf("round %d: job after the race = %+v", r, got)
		}
		if n := len(f.events(j.ID, "lease.stale_report")); n != (writers+1)*len(attemptOps(st, f, ref(c1), staleNow)) {
			t.Fatalf("round %d: %d stale reports", r, n)
		}
		// End the round's job so that the next round claims its own.
		if _, err := st.Finish(f.ctx, ref(c2), wire.FinishRequest{AttemptRef: ref(c2), Outcome: wire.OutcomeFailed}, base.Add(TTL+3*time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
}

// Release races admission of the same attempt: never both succeed.
func testRaceReleaseVsAdmission(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	const rounds = 30
	wins := map[string]int{}
	for r := 0; r < rounds; r++ {
		conv := f.conversation()
		j := f.enqueue(conv.ID, "p")
		c := f.claim(T0)
		var relErr, admErr error
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			relErr = st.Release(f.ctx, ref(c), wire.ReleaseRequest{AttemptRef: ref(c), Class: "declined:preflight"}, at(time.Second))
		}()
		go func() {
			defer wg.Done()
			<-start
			_, admErr = st.Admit(f.ctx, ref(c), "act", at(time.Second))
		}()
		close(start)
		wg.Wait()
		got := f.job(j.ID)
		switch {
		case relErr == nil && admErr == nil:
			t.Fatalf("round %d: release and admission both succeeded", r)
		case relErr == nil:
			wantErr(t, "admission after release", admErr, store.ErrLeaseLost)
			if got.State != wire.JobQueued || got.Admitted {
				t.Fatalf("round %d: released job = %+v", r, got)
			}
			wins["release"]++
			if _, err := st.CancelJob(f.ctx, j.ID, at(2*time.Second)); err != nil { // keep the queue for the next round
				t.Fatal(err)
			}
		case admErr == nil:
			wantErr(t, "release after admission", relErr, store.ErrAdmitted)
			if got.State != wire.JobRunning || !got.Admitted {
				t.Fatalf("round %d: admitted job = %+v", r, got)
			}
			wins["admission"]++
		default:
			t.Fatalf("round %d: both failed: release %v, admission %v", r, relErr, admErr)
		}
	}
	t.Logf("wins: %v", wins)
}

// The reaper races a late finish of the same attempt: exactly one wins;
// a refused finish is recorded as lease.stale_report.
func testRaceReaperVsLateFinish(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	const rounds = 30
	grace := 10 * time.Second
	wins := map[string]int{}
	for r := 0; r < rounds; r++ {
		base := at(time.Duration(r) * time.Hour)
		conv := f.conversation()
		j := f.enqueue(conv.ID, "p")
		c := f.claim(base)
		var res store.ReapResult
		var reapErr, finErr error
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			res, reapErr = st.Reap(f.ctx, store.ReapParams{Now: base.Add(TTL + grace + time.Second), Grace: grace})
		}()
		go func() {
			defer wg.Done()
			<-start
			// Sent before expiry by this replica's clock; another replica's
			// reaper is already past expiry plus grace.
			_, finErr = st.Finish(f.ctx, ref(c), wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeFailed, Class: "agent_exit"}, base.Add(TTL-time.Second))
		}()
		close(start)
		wg.Wait()
		if reapErr != nil {
			t.Fatal(reapErr)
		}
		got := f.job(j.ID)
		stale := len(f.events(j.ID, "lease.stale_report"))
		switch {
		case finErr == nil && res.Superseded == 0:
			if got.State != wire.JobFailed || got.Attempts[0].State != wire.AttemptFinished || stale != 0 {
				t.Fatalf("round %d: finish won but job = %+v, %d stale reports", r, got, stale)
			}
			wins["finish"]++
		case errors.Is(finErr, store.ErrLeaseLost) && res.Superseded == 1:
			if got.Attempts[0].State != wire.AttemptSuperseded || stale != 1 {
				t.Fatalf("round %d: reaper won but job = %+v, %d stale reports", r, got, stale)
			}
			wins["reaper"]++
			if _, err := st.CancelJob(f.ctx, j.ID, base.Add(time.Hour-time.Second)); err != nil { // requeued: take it off the queue
				t.Fatal(err)
			}
		default:
			t.Fatalf("round %d: finish %v and reap %+v", r, finErr, res)
		}
	}
	t.Logf("wins: %v", wins)
}

// The same upload sent several times at once (a runner's retry racing its
// first request, still in flight): every one is answered 200 with the
// same stored_through — a duplicate is a replay — and each event is
// stored once, the job's events numbered without a gap.
func testRaceSameSeqUploads(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	const uploads, rounds = 8, 5
	j := f.enqueue(f.conversation().ID, "p")
	c := f.claim(T0)
	w := store.Worker{JobID: c.JobID, TokenHash: Hash(tokenOf(f, c))}
	for round := range rounds {
		events := []wire.Event{
			{Seq: int64(2*round + 1), Time: T0, Type: "agent.output", Data: []byte(`{"text":"a"}`)},
			{Seq: int64(2*round + 2), Time: T0, Type: "agent.output", Data: []byte(`{"text":"b"}`)},
		}
		var wg sync.WaitGroup
		resps := make([]wire.EventsResponse, uploads)
		errs := make([]error, uploads)
		for i := range uploads {
			wg.Go(func() { resps[i], errs[i] = st.AppendEventsAs(f.ctx, w, ref(c), events, at(time.Second)) })
		}
		wg.Wait()
		for i := range uploads {
			if errs[i] != nil || resps[i].StoredThrough != int64(2*round+2) {
				t.Fatalf("round %d, upload %d = %+v, %v; want stored_through %d", round, i, resps[i], errs[i], 2*round+2)
			}
		}
	}
	all, err := st.JobEvents(f.ctx, j.ID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	runner := 0
	for i, e := range all {
		if e.ID != int64(i+1) {
			t.Fatalf("event %d is numbered %d: %+v", i+1, e.ID, all)
		}
		if e.Source == "runner" {
			runner++
		}
	}
	if runner != 2*rounds {
		t.Fatalf("%d runner events stored, want %d", runner, 2*rounds)
	}
}
