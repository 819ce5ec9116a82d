package storetest

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// supersededKeys are the only fields of an attempt_superseded event: they
// describe the lease that ended, nothing that came after it.
var supersededKeys = map[string]bool{"lease_generation": true, "lease_owner": true, "lease_expires_at": true, "admitted": true}

// checkAnnouncesOnlyExisting fails unless every attempt GetJob lists has
// its own claimed event, and every event names an attempt that exists.
func checkAnnouncesOnlyExisting(t *testing.T, j wire.Job) {
	t.Helper()
	exists := map[string]bool{}
	for _, a := range j.Attempts {
		exists[a.ID] = true
	}
	claimed := map[string]int{}
	for _, e := range j.Events {
		if e.AttemptID != "" && !exists[e.AttemptID] {
			t.Fatalf("event %s names attempt %s, which GetJob does not list", e.Type, e.AttemptID)
		}
		if e.Type == "claimed" {
			claimed[e.AttemptID]++
		}
	}
	for _, a := range j.Attempts {
		if claimed[a.ID] != 1 {
			t.Fatalf("attempt %s is listed with %d claimed events, want its own one", a.ID, claimed[a.ID])
		}
	}
}

// checkSuperseded checks the one attempt_superseded event of attempt c: it
// names that attempt only, with its own lease.
func checkSuperseded(t *testing.T, f *fixture, jobID string, c wire.Claim, owner string) {
	t.Helper()
	evs := f.events(jobID, "attempt_superseded")
	if len(evs) != 1 || evs[0].AttemptID != c.AttemptID {
		t.Fatalf("attempt_superseded events %+v, want one for %s", evs, c.AttemptID)
	}
	var data map[string]any
	if err := json.Unmarshal(evs[0].Data, &data); err != nil {
		t.Fatalf("attempt_superseded data %s: %v", evs[0].Data, err)
	}
	for k := range data {
		if !supersededKeys[k] {
			t.Fatalf("attempt_superseded carries %q (%s): it may only describe the lease that ended", k, evs[0].Data)
		}
	}
	if data["lease_owner"] != owner || data["lease_generation"] != float64(c.LeaseGeneration) {
		t.Fatalf("attempt_superseded data %s, want the ended lease: owner %s, generation %d", evs[0].Data, owner, c.LeaseGeneration)
	}
}

// R20: an attempt_superseded event does not claim that another attempt
// ran. Its data names no other attempt; GetJob lists only attempts that
// exist, and a new attempt appears only with its own claimed event — for a
// requeued turn and for an admitted one whose conversation is lost.
func testR20SupersededDoesNotAnnounceAnotherAttempt(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	hostB := f.newHost("host-b")
	grace := 10 * time.Second

	// Never admitted: superseded and queued again, and no attempt runs
	// until a host claims it.
	j := f.enqueue(f.conversation().ID, "p")
	c1 := f.claim(T0)
	if res, err := st.Reap(f.ctx, store.ReapParams{Now: at(TTL + time.Minute), Grace: grace}); err != nil || res.Superseded != 1 {
		t.Fatalf("Reap = %+v, %v", res, err)
	}
	got := f.job(j.ID)
	if got.State != wire.JobQueued || len(got.Attempts) != 1 || got.Attempts[0].ID != c1.AttemptID ||
		got.Attempts[0].State != wire.AttemptSuperseded {
		t.Fatalf("after the reaper: state %s, attempts %+v; want queued with the one superseded attempt", got.State, got.Attempts)
	}
	checkSuperseded(t, f, j.ID, c1, f.host.Name)
	checkAnnouncesOnlyExisting(t, got)
	// A later sweep announces nothing either.
	if _, err := st.Reap(f.ctx, store.ReapParams{Now: at(time.Hour), Grace: grace}); err != nil {
		t.Fatal(err)
	}
	if again := f.job(j.ID); len(again.Attempts) != 1 || len(again.Events) != len(got.Events) {
		t.Fatalf("a sweep with nothing expired changed the job: %d attempts, %d events (was %d)", len(again.Attempts), len(again.Events), len(got.Events))
	}
	c2, ok := f.tryClaim(hostB, at(time.Hour))
	if !ok || c2.JobID != j.ID {
		t.Fatalf("host-b's claim = %+v, %v", c2, ok)
	}
	got = f.job(j.ID)
	if len(got.Attempts) != 2 || got.Attempts[1].ID != c2.AttemptID || got.Attempts[1].LeaseOwner != hostB.Name {
		t.Fatalf("after host-b's claim: attempts %+v", got.Attempts)
	}
	checkSuperseded(t, f, j.ID, c1, f.host.Name) // unchanged by the new attempt
	checkAnnouncesOnlyExisting(t, got)

	// Admitted: the conversation is quarantined (K13) and no attempt follows, ever.
	conv := f.conversation()
	j2 := f.enqueue(conv.ID, "q")
	c3 := f.claim(at(2 * time.Hour))
	f.admit(c3, at(2*time.Hour))
	if res, err := st.Reap(f.ctx, store.ReapParams{Now: at(3 * time.Hour), Grace: grace}); err != nil || res.ConversationsQuarantined != 1 {
		t.Fatalf("Reap = %+v, %v", res, err)
	}
	if c, ok := f.tryClaim(hostB, at(3*time.Hour)); ok && c.JobID == j2.ID {
		t.Fatalf("the admitted, superseded turn was claimed again: %+v", c)
	}
	got = f.job(j2.ID)
	if got.State != wire.JobFailed || len(got.Attempts) != 1 || got.Attempts[0].ID != c3.AttemptID {
		t.Fatalf("admitted turn after the reaper: state %s, attempts %+v", got.State, got.Attempts)
	}
	checkSuperseded(t, f, j2.ID, c3, f.host.Name)
	checkAnnouncesOnlyExisting(t, got)
}
