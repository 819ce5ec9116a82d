package storetest

import (
	"sync"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// K3: after the control plane's own absence, the guarded statement itself
// accepts a lease whose expiry fell inside the absence, before any sweep
// resumed it; a lease that expired before the absence began stays expired,
// and the reaper supersedes only that one.
func testK3AbsenceDecidedInTheGuard(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	gap := time.Minute
	for _, p := range []string{"live", "dead", "finishes"} {
		f.enqueue(f.conversation().ID, p)
	}
	live, dead, finishes := f.claim(T0), f.claim(T0), f.claim(T0)
	// The control plane sweeps every 30 s until 3 min; the dead worker's
	// lease (to 2 min) expires while it is there, the others renew.
	for d := time.Duration(0); d <= 3*time.Minute; d += 30 * time.Second {
		if n, err := st.ResumeAfterAbsence(f.ctx, at(d), gap); err != nil || n != 0 {
			t.Fatalf("ResumeAfterAbsence at %v = %d, %v", d, n, err)
		}
		if d == 90*time.Second {
			for _, c := range []wire.Claim{live, finishes} {
				if _, err := st.Renew(f.ctx, ref(c), TTL, at(d)); err != nil {
					t.Fatalf("renew at %v: %v", d, err)
				}
			}
		}
	}
	// Away from 3 min to 20 min: the live leases (to 3.5 min) expired
	// inside the absence. No sweep has run since.
	back := at(20 * time.Minute)
	if _, err := st.Renew(f.ctx, ref(live), TTL, back); err != nil {
		t.Fatalf("renewal after the absence, before any sweep: %v", err)
	}
	if _, err := st.AppendEvents(f.ctx, ref(finishes), []wire.Event{{Seq: 1, Type: "agent.output"}}, back); err != nil {
		t.Fatalf("events after the absence: %v", err)
	}
	if _, err := st.Finish(f.ctx, ref(finishes), wire.FinishRequest{AttemptRef: ref(finishes), Outcome: wire.OutcomeFailed}, back); err != nil {
		t.Fatalf("finish after the absence: %v", err)
	}
	_, err := st.Renew(f.ctx, ref(dead), TTL, back)
	wantErr(t, "renewal of a lease that expired before the absence", err, store.ErrLeaseLost)
	// A reaper sweep that did not resume first still blames only the
	// worker that was silent while the control plane was there.
	res, err := st.Reap(f.ctx, store.ReapParams{Now: back.Add(time.Second), Grace: time.Second})
	if err != nil || res.Superseded != 1 {
		t.Fatalf("Reap inside the absence = %+v, %v; want only the dead worker's attempt", res, err)
	}
	if a := f.job(dead.JobID).Attempts[0]; a.State != wire.AttemptSuperseded {
		t.Fatalf("dead worker's attempt = %+v", a)
	}
	if a := f.job(live.JobID).Attempts[0]; a.State != wire.AttemptRunning || !a.LeaseExpiresAt.Equal(back.Add(TTL)) {
		t.Fatalf("renewed attempt = %+v, want running to %v", a, back.Add(TTL).Sub(T0))
	}
}

// K3: renewals that race the sweep ending an absence are every one
// accepted — none refused for the expiry inside the absence, none refused
// "without cause" because the resume committed between a renewal's
// statement and its check.
func testK3RenewalsRaceTheResume(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	gap := time.Minute
	if _, err := st.ResumeAfterAbsence(f.ctx, T0, gap); err != nil {
		t.Fatal(err)
	}
	const n = 12
	claims := make([]wire.Claim, n)
	for i := range claims {
		f.enqueue(f.conversation().ID, "p")
		claims[i] = f.claim(T0)
	}
	back := at(10 * time.Minute) // every lease (to 2 min) ran out inside the absence
	var wg sync.WaitGroup
	errs := make(chan error, 2*n+1)
	start := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-start
		_, err := st.ResumeAfterAbsence(f.ctx, back, gap)
		errs <- err
	}()
	for _, c := range claims {
		for k := 0; k < 2; k++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, err := st.Renew(f.ctx, ref(c), TTL, back.Add(time.Duration(k)*time.Millisecond))
				errs <- err
			}()
		}
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a call racing the resume failed: %v", err)
		}
	}
	for _, c := range claims {
		j := f.job(c.JobID)
		if a := j.Attempts[0]; a.State != wire.AttemptRunning || a.LeaseExpiresAt.Before(back.Add(TTL)) {
			t.Fatalf("attempt after the race = %+v", a)
		}
		if len(f.events(c.JobID, "lease.stale_report")) != 0 {
			t.Fatalf("job %s recorded a stale report", c.JobID)
		}
	}
}

// K3: the absence is one record the database keeps, not a comparison of
// sweeps: sweeps of several replicas interleave and never move it back, so
// a sweep with an older reading after a newer one is no absence.
func testK3AbsenceRecordNeverMovesBack(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	gap := 10 * time.Second
	f.enqueue(f.conversation().ID, "p")
	c := f.claim(T0)
	for d := time.Duration(0); d < 5*time.Minute; d += 8 * time.Second {
		// Two replicas' sweeps, read seconds apart and committed in
		// either order.
		for _, now := range []time.Time{at(d + 5*time.Second), at(d)} {
			if n, err := st.ResumeAfterAbsence(f.ctx, now, gap); err != nil || n != 0 {
				t.Fatalf("ResumeAfterAbsence at %v = %d, %v", now.Sub(T0), n, err)
			}
		}
	}
	if got := f.events(c.JobID, "lease_extended_after_absence"); len(got) != 0 {
		t.Fatalf("a lease was extended: %+v", got)
	}
	res, err := st.Reap(f.ctx, store.ReapParams{Now: at(5 * time.Minute), Grace: 10 * time.Second})
	if err != nil || res.Superseded != 1 {
		t.Fatalf("Reap = %+v, %v; want the silent worker's attempt superseded", res, err)
	}
}
