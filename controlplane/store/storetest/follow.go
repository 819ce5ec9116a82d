package storetest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// A follower paging a job's events by the last number it saw, while
// several writers add events to that job at once — the live runner's
// uploads, the refused writes of a superseded attempt (each keeps a
// lease.stale_report) and the control plane's own transitions — sees every
// event exactly once and in order: numbers 1, 2, 3, … with none passed
// over because its transaction committed late.
func testRaceEventsFollowerSeesEveryEventOnce(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	conv := f.conversation()
	j := f.enqueue(conv.ID, "p")
	old := f.claim(T0)
	if res, err := st.Reap(f.ctx, store.ReapParams{Now: at(TTL + time.Minute), Grace: time.Second}); err != nil || res.Superseded != 1 {
		t.Fatalf("Reap = %+v, %v", res, err)
	}
	now := at(TTL + 2*time.Minute)
	live := f.claim(now)
	const uploaders, batches, perBatch, stale = 4, 25, 3, 40
	var wg sync.WaitGroup
	errs := make(chan error, uploaders*batches+stale)
	for u := 0; u < uploaders; u++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := 0; b < batches; b++ {
				evs := make([]wire.Event, perBatch)
				for i := range evs {
					evs[i] = wire.Event{Seq: int64(1 + (u*batches+b)*perBatch + i), Type: "agent.output"}
				}
				if _, err := st.AppendEvents(f.ctx, ref(live), evs, now); err != nil {
					errs <- fmt.Errorf("upload: %w", err)
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < stale; i++ {
			if _, err := st.Renew(f.ctx, ref(old), TTL, now); err == nil {
				errs <- fmt.Errorf("a superseded attempt's renewal was accepted")
			}
		}
	}()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	var seen []wire.JobEvent
	follow := func() {
		after := int64(0)
		if len(seen) > 0 {
			after = seen[len(seen)-1].ID
		}
		page, err := st.JobEvents(f.ctx, j.ID, after, 7)
		if err != nil {
			t.Fatalf("JobEvents: %v", err)
		}
		seen = append(seen, page...)
	}
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
			follow()
		}
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for before := -1; before != len(seen); {
		before = len(seen)
		follow()
	}
	all, err := st.JobEvents(f.ctx, j.ID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := uploaders*batches*perBatch + stale; len(f.events(j.ID, "agent.output"))+len(f.events(j.ID, "lease.stale_report")) != want {
		t.Fatalf("stored %d uploads and stale reports, want %d", len(f.events(j.ID, "agent.output"))+len(f.events(j.ID, "lease.stale_report")), want)
	}
	if len(seen) != len(all) {
		t.Fatalf("the follower saw %d events, the job has %d", len(seen), len(all))
	}
	for i, e := range seen {
		if e.ID != int64(i+1) || e.ID != all[i].ID || e.Type != all[i].Type || e.AttemptID != all[i].AttemptID {
			t.Fatalf("event %d the follower saw = %+v, the job's = %+v", i+1, e, all[i])
		}
	}
}
