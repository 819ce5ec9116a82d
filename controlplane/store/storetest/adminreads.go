package storetest

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// The reads of the Admin pages at a glance: RunningTurns lists exactly the
// running attempts, with the turn number and the name of the host holding
// each (those ListServers counts as its Running), by host, oldest claim
// first; ConversationTitles reads the titles of the ids asked, untitled
// ones included, and none for an unknown id.
func testAdminReads(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	hostB := f.newHost("host-b")
	titled := func(title string) wire.Conversation {
		t.Helper()
		c, err := st.CreateConversation(f.ctx, wire.CreateConversationRequest{Title: title, Image: "img:1", AgentCommand: []string{"agent"}}, T0)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c1, c2, c3 := titled("Fix the login bug"), titled(""), titled("Spare")
	j1 := f.enqueue(c1.ID, "one")
	j2 := f.enqueue(c2.ID, "two")
	j1b := f.enqueue(c1.ID, "again") // waits behind j1
	f.enqueue(c3.ID, "three")

	a := f.claim(at(time.Second)) // host-a: j1
	b, ok := f.tryClaim(hostB, at(2*time.Second))
	if !ok || a.JobID != j1.ID || b.JobID != j2.ID {
		t.Fatalf("claims took %s and %s (%v), want %s and %s", a.JobID, b.JobID, ok, j1.ID, j2.ID)
	}
	c := f.claim(at(3 * time.Second)) // host-a: the spare conversation's turn
	if _, err := st.Finish(f.ctx, ref(c), wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeFailed, Class: "agent_exit"}, at(4*time.Second)); err != nil {
		t.Fatal(err)
	}

	got, err := st.RunningTurns(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []store.RunningTurn{{JobID: j1.ID, Seq: 1, Host: "host-a", ClaimedAt: at(time.Second)}, {JobID: j2.ID, Seq: 1, Host: "host-b", ClaimedAt: at(2 * time.Second)}}
	if !slices.EqualFunc(got, want, func(x, y store.RunningTurn) bool {
		return x.JobID == y.JobID && x.Seq == y.Seq && x.Host == y.Host && x.ClaimedAt.Equal(y.ClaimedAt)
	}) {
		t.Fatalf("RunningTurns = %+v, want %+v", got, want)
	}
	servers, err := st.ListServers(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sv := range servers {
		n := 0
		for _, rt := range got {
			if rt.Host == sv.Name {
				n++
			}
		}
		if n != sv.Running {
			t.Fatalf("%s: ListServers counts %d running, RunningTurns lists %d", sv.Name, sv.Running, n)
		}
	}
	if _, err := st.Finish(f.ctx, ref(a), wire.FinishRequest{AttemptRef: ref(a), Outcome: wire.OutcomeFailed, Class: "agent_exit"}, at(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if next := f.claim(at(6 * time.Second)); next.JobID != j1b.ID {
		t.Fatalf("host-a's next claim took %s, want %s", next.JobID, j1b.ID)
	}
	if got, err = st.RunningTurns(f.ctx); err != nil || len(got) != 2 || got[0].JobID != j1b.ID || got[0].Seq != 2 {
		t.Fatalf("RunningTurns after j1 ended = %+v, %v; want turn 2 of c1 on host-a first", got, err)
	}

	titles, err := st.ConversationTitles(f.ctx, []string{c1.ID, c2.ID, "conv_unknown"})
	if err != nil {
		t.Fatal(err)
	}
	if wantT := map[string]string{c1.ID: "Fix the login bug", c2.ID: ""}; !maps.Equal(titles, wantT) {
		t.Fatalf("ConversationTitles = %v, want %v", titles, wantT)
	}
	if none, err := st.ConversationTitles(f.ctx, nil); err != nil || len(none) != 0 {
		t.Fatalf("ConversationTitles(nil) = %v, %v", none, err)
	}
}
