package storetest

import (
	"slices"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// ListJobs (Admin → Jobs, GET /v1/jobs) selects by state, outcome, error
// class, conversation, the host that held a lease and creation time,
// newest first, each job with its attempts in generation order; its pages
// of Limit jobs, followed by their Next cursor, list every job once.
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
		if _, err := st.Finish(f.ctx, ref(c), wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeFailed, Class: "agent_exit"}, at(TTL+2*time.Minute)); err != nil {
			t.Fatal(err)
		}
	}

	list := func(fl store.JobFilter) []string {
		t.Helper()
		l, err := st.ListJobs(f.ctx, fl)
		if err != nil {
			t.Fatalf("ListJobs(%+v): %v", fl, err)
		}
		var ids []string
		for _, j := range l.Jobs {
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
	check("failed with outcome failed", store.JobFilter{Outcome: wire.OutcomeFailed}, j2.ID)
	check("succeeded", store.JobFilter{Outcome: wire.OutcomeSucceeded})
	check("of class agent_exit", store.JobFilter{Class: "agent_exit"}, j2.ID)
	check("of class agent", store.JobFilter{Class: "agent"}) // a class, not a prefix
	check("created since the first", store.JobFilter{Since: f.job(j1.ID).CreatedAt}, j3.ID, j2.ID, j1.ID)
	check("created after the last", store.JobFilter{Since: f.job(j3.ID).CreatedAt.Add(time.Nanosecond)})
	if _, err := st.ListJobs(f.ctx, store.JobFilter{Class: "x%"}); err == nil {
		t.Error("ListJobs of class \"x%\" answered; a class with a pattern character must be refused")
	}

	// Pages of one, each from the cursor of the one before, list every
	// job once, newest first, and the last says there is no next.
	var paged []string
	var before int64
	for range 4 {
		l, err := st.ListJobs(f.ctx, store.JobFilter{Limit: 1, Before: before})
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range l.Jobs {
			paged = append(paged, j.ID)
		}
		if before = l.Next; before == 0 {
			break
		}
	}
	if want := []string{j3.ID, j2.ID, j1.ID}; !slices.Equal(paged, want) || before != 0 {
		t.Errorf("pages of one listed %v (next cursor %d), want %v and no cursor after the last", paged, before, want)
	}
	// A job queued after the first page came does not shift the pages
	// after it: the cursor is a queue position, not an offset.
	first, _ := st.ListJobs(f.ctx, store.JobFilter{Limit: 1})
	f.enqueue(c2.ID, "four")
	if second, err := st.ListJobs(f.ctx, store.JobFilter{Limit: 1, Before: first.Next}); err != nil || len(second.Jobs) != 1 || second.Jobs[0].ID != j2.ID {
		t.Errorf("the second page after a new job: %+v, %v; want %s", second.Jobs, err, j2.ID)
	}

	running, err := st.ListJobs(f.ctx, store.JobFilter{State: wire.JobRunning})
	js := running.Jobs
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
