package storetest

import (
	"slices"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// ListJobs (Admin → Jobs) selects by state, conversation and the host
// that held a lease, newest first, each job with its attempts in
// generation order, and honours its limit.
func testListJobs(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	hostB := f.newHost("host-b")
	c1, c2 := f.conversation(), f.conversation()
	j1 := f.enqueue(c1.ID, "one")
	j2 := f.enqueue(c2.ID, "two")
	j3 := f.enqueue(c1.ID, "three") // waits behind j1

	// j1 runs on host-a and is superseded; host-b claims it again.
	a := f.claim(T0)
	if a.JobID != j1.ID {
		t.Fatalf("first claim took %s, want %s", a.JobID, j1.ID)
	}
	if _, err := st.Reap(f.ctx, store.ReapParams{Now: at(TTL + time.Minute), Grace: time.Second}); err != nil {
		t.Fatal(err)
	}
	b, ok := f.tryClaim(hostB, at(TTL+2*time.Minute))
	if !ok || b.JobID != j1.ID {
		t.Fatalf("host-b's claim = %+v, %v; want the requeued %s", b, ok, j1.ID)
	}
	// j2 runs on host-a and fails before admission.
	if c := f.claim(at(TTL + 2*time.Minute)); c.JobID != j2.ID {
		t.Fatalf("host-a's second claim took %s, want %s", c.JobID, j2.ID)
	} else {
		f.finish(c, wire.OutcomeFailed, at(TTL+2*time.Minute))
	}

	list := func(fl store.JobFilter) []string {
		t.Helper()
		js, err := st.ListJobs(f.ctx, fl)
		if err != nil {
			t.Fatalf("ListJobs(%+v): %v", fl, err)
		}
		var ids []string
		for _, j := range js {
			ids = append(ids, j.ID)
		}
		return ids
	}
	check := func(what string, fl store.JobFilter, want ...string) {
		t.Helper()
		if got := list(fl); !slices.Equal(got, want) {
			t.Fatalf("ListJobs %s = %v, want %v", what, got, want)
		}
	}
	check("of all", store.JobFilter{}, j3.ID, j2.ID, j1.ID)
	check("running", store.JobFilter{State: wire.JobRunning}, j1.ID)
	check("queued", store.JobFilter{State: wire.JobQueued}, j3.ID)
	check("failed", store.JobFilter{State: wire.JobFailed}, j2.ID)
	check("of conversation 1", store.JobFilter{ConversationID: c1.ID}, j3.ID, j1.ID)
	check("of conversation 1, queued", store.JobFilter{ConversationID: c1.ID, State: wire.JobQueued}, j3.ID)
	check("held by host-a", store.JobFilter{Host: "host-a"}, j2.ID, j1.ID)
	check("held by host-b", store.JobFilter{Host: "host-b"}, j1.ID)
	check("held by nobody's host", store.JobFilter{Host: "host-z"})
	check("of an unknown conversation", store.JobFilter{ConversationID: "conv_nope"})
	check("limited to 2", store.JobFilter{Limit: 2}, j3.ID, j2.ID)

	js, err := st.ListJobs(f.ctx, store.JobFilter{State: wire.JobRunning})
	if err != nil || len(js) != 1 {
		t.Fatalf("ListJobs running = %+v, %v", js, err)
	}
	got := js[0]
	if len(got.Attempts) != 2 || got.Attempts[0].ID != a.AttemptID || got.Attempts[0].LeaseOwner != "host-a" ||
		got.Attempts[0].State != wire.AttemptSuperseded || got.Attempts[1].ID != b.AttemptID ||
		got.Attempts[1].LeaseOwner != "host-b" || got.Attempts[1].Generation <= got.Attempts[0].Generation {
		t.Fatalf("listed job's attempts = %+v; want host-a's superseded one, then host-b's", got.Attempts)
	}
	if len(got.Events) != 0 {
		t.Fatalf("listed job carries %d events; ListJobs leaves them to GetJob", len(got.Events))
	}
	one := f.job(j1.ID)
	if got.State != one.State || got.ConversationID != one.ConversationID || got.Seq != one.Seq || got.AttemptCount != one.AttemptCount {
		t.Fatalf("listed job %+v differs from GetJob's %+v", got, one)
	}
}
