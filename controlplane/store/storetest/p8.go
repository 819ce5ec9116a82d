package storetest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// timeline is what retention keeps of a job's events: ids, types, times,
// sources and attempts.
func timeline(j wire.Job) []string {
	out := make([]string, len(j.Events))
	for i, e := range j.Events {
		out[i] = fmt.Sprintf("%d %s %s %s %s %s", e.ID, e.JobID, e.AttemptID, e.Time.Format(time.RFC3339Nano), e.Source, e.Type)
	}
	return out
}

// P8: past the retention window an ended job's bulky detail is reclaimed —
// the prompt, the worker token hashes, runner event payloads and the
// runner's report with its reason text — while its row, counts, states,
// outcome and timeline stay, and reads show when the detail was reclaimed.
// Jobs inside the window and unfinished ones keep everything; a sweep is
// bounded by Limit and reclaims a job once.
func testP8RetentionReclaimsDetailKeepsTimeline(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	conv := f.conversation()
	old := f.enqueue(conv.ID, "old secret prompt")
	c := f.claim(at(time.Second))
	if _, err := st.AppendEvents(f.ctx, ref(c), []wire.Event{{Seq: 1, Type: "agent.output", Data: []byte(`{"text":"private output"}`)}}, at(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	f.recordContainer(c, "ctr-1", at(3*time.Second))
	f.admit(c, at(4*time.Second))
	f.settle(c, 1, at(5*time.Second))
	if _, err := st.Finish(f.ctx, ref(c), wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeSucceeded, Reason: "operator detail"}, at(6*time.Second)); err != nil {
		t.Fatal(err)
	}
	before := f.job(old.ID)
	if before.Prompt != "old secret prompt" || before.DetailReclaimedAt != nil {
		t.Fatalf("before retention: prompt %q, reclaimed at %v", before.Prompt, before.DetailReclaimedAt)
	}

	// Inside the window: ended an hour later. Unfinished: queued.
	recent := f.enqueue(conv.ID, "recent prompt")
	rc := f.claim(at(time.Hour))
	f.finish(rc, wire.OutcomeFailed, at(time.Hour+time.Second))
	pending := f.enqueue(f.conversation().ID, "pending prompt")

	now := at(31 * 24 * time.Hour)
	window := at(30 * time.Minute)
	n, err := st.ReclaimDetail(f.ctx, store.ReclaimParams{Now: now, Before: window})
	if err != nil || n != 1 {
		t.Fatalf("ReclaimDetail = %d, %v; want the one job that ended before the window", n, err)
	}
	after := f.job(old.ID)
	if after.DetailReclaimedAt == nil || !after.DetailReclaimedAt.Equal(now) || after.Prompt != "" {
		t.Fatalf("after retention: prompt %q, reclaimed at %v; want empty, %v", after.Prompt, after.DetailReclaimedAt, now)
	}
	// Row, counts, states, outcome and attempts stay.
	kept, was := after, before
	kept.Prompt, kept.DetailReclaimedAt, kept.Events = "", nil, nil
	was.Prompt, was.Events = "", nil
	if !jobsEqual(kept, was) {
		t.Fatalf("retention changed the job:\n%+v\nwas\n%+v", kept, was)
	}
	// The timeline stays; payloads of runner events and of the report go.
	if !slices.Equal(timeline(after), timeline(before)) {
		t.Fatalf("timeline changed:\n%+v\nwas\n%+v", timeline(after), timeline(before))
	}
	for _, e := range after.Events {
		cleared := e.Source == "runner" || e.Type == "finished"
		if cleared && len(e.Data) > 0 {
			t.Fatalf("%s %s keeps its data %s", e.Source, e.Type, e.Data)
		}
		if e.Type == "claimed" && len(e.Data) == 0 {
			t.Fatal("the claimed event lost its lease owner and expiry (R19)")
		}
	}
	// The worker credential is gone: its token no longer authorizes.
	_, err = st.AuthorizeAttempt(f.ctx, old.ID, Hash(tokenOf(f, c)))
	wantErr(t, "AuthorizeAttempt with a reclaimed credential", err, store.ErrUnauthorized)

	for _, id := range []string{recent.ID, pending.ID} {
		if j := f.job(id); j.DetailReclaimedAt != nil || j.Prompt == "" {
			t.Fatalf("job %s inside the window or unfinished was reclaimed: %+v", id, j)
		}
	}
	if _, err := st.AuthorizeAttempt(f.ctx, recent.ID, Hash(tokenOf(f, rc))); err != nil {
		t.Fatalf("AuthorizeAttempt inside the window: %v", err)
	}
	// Once only; the conversation goes on.
	if n, err := st.ReclaimDetail(f.ctx, store.ReclaimParams{Now: now.Add(time.Hour), Before: window}); err != nil || n != 0 {
		t.Fatalf("second ReclaimDetail = %d, %v", n, err)
	}
	if j := f.job(old.ID); !j.DetailReclaimedAt.Equal(now) {
		t.Fatalf("reclaimed again at %v", j.DetailReclaimedAt)
	}
	f.enqueue(conv.ID, "next")

	// Limit bounds a sweep; the next takes the rest.
	for i := 0; i < 3; i++ {
		f.enqueue(f.conversation().ID, "more")
	}
	for i := 0; i < 4; i++ { // pending and the three new ones
		c := f.claim(at(2 * time.Hour))
		f.finish(c, wire.OutcomeFailed, at(2*time.Hour))
	}
	later := at(3 * time.Hour)
	if n, err := st.ReclaimDetail(f.ctx, store.ReclaimParams{Now: now, Before: later, Limit: 3}); err != nil || n != 3 {
		t.Fatalf("ReclaimDetail with Limit 3 = %d, %v", n, err)
	}
	if n, err := st.ReclaimDetail(f.ctx, store.ReclaimParams{Now: now, Before: later, Limit: 3}); err != nil || n != 2 {
		t.Fatalf("the next ReclaimDetail = %d, %v; want the two left", n, err)
	}
}

// jobsEqual compares jobs field by field, attempts included.
func jobsEqual(a, b wire.Job) bool {
	if a.ID != b.ID || a.ConversationID != b.ConversationID || a.Seq != b.Seq || a.State != b.State || a.Outcome != b.Outcome ||
		a.Reason != b.Reason || a.CancelRequested != b.CancelRequested || a.AttemptCount != b.AttemptCount ||
		a.WorkerLostCount != b.WorkerLostCount || a.Admitted != b.Admitted || !a.CreatedAt.Equal(b.CreatedAt) ||
		(a.EndedAt == nil) != (b.EndedAt == nil) || (a.EndedAt != nil && !a.EndedAt.Equal(*b.EndedAt)) ||
		len(a.Attempts) != len(b.Attempts) {
		return false
	}
	for i := range a.Attempts {
		x, y := a.Attempts[i], b.Attempts[i]
		if x.ID != y.ID || x.Generation != y.Generation || x.State != y.State || x.LeaseOwner != y.LeaseOwner ||
			!x.LeaseExpiresAt.Equal(y.LeaseExpiresAt) || !x.ClaimedAt.Equal(y.ClaimedAt) || x.Outcome != y.Outcome ||
			x.ContainerID != y.ContainerID || x.ActivationID != y.ActivationID || x.CountsAsAttempt != y.CountsAsAttempt {
			return false
		}
	}
	return true
}
