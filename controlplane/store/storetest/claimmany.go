package storetest

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
)

// testClaimMany: a batched claim takes up to one turn per slot, in queue
// order, each the head of its conversation (never two of one), each its
// own attempt with the slot's id and worker token, lease and claimed
// event; the turns it cannot fill are none, not an error.
func testClaimMany(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	a, b, c := f.conversation(), f.conversation(), f.conversation()
	a1, _ := f.enqueue(a.ID, "a1"), f.enqueue(a.ID, "a2")
	b1, c1 := f.enqueue(b.ID, "b1"), f.enqueue(c.ID, "c1")
	p := store.ClaimParams{HostID: f.host.ID, LeaseTTL: TTL, WorkerTokenHash: Hash("many-0"), Now: T0,
		More: []store.ClaimSlot{{WorkerTokenHash: Hash("many-1")}, {AttemptID: "att_mine", WorkerTokenHash: Hash("many-2")}, {WorkerTokenHash: Hash("many-3")}}}
	cs, err := st.ClaimMany(f.ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	var jobs []string
	for _, c := range cs {
		jobs = append(jobs, c.JobID)
	}
	if want := []string{a1.ID, b1.ID, c1.ID}; !slices.Equal(jobs, want) {
		t.Fatalf("ClaimMany of 4 slots took %v; want the three heads %v in queue order", jobs, want)
	}
	if cs[2].AttemptID != "att_mine" {
		t.Fatalf("the third turn's attempt is %s, want the slot's att_mine", cs[2].AttemptID)
	}
	for i, c := range cs {
		auth, err := st.AuthorizeAttempt(f.ctx, c.JobID, Hash(fmt.Sprintf("many-%d", i)))
		if err != nil || auth.AttemptID != c.AttemptID || auth.HostID != f.host.ID {
			t.Fatalf("turn %d: slot %d's token authorizes %+v, %v; want attempt %s", i, i, auth, err, c.AttemptID)
		}
		if c.LeaseGeneration != 1 || !c.LeaseExpiresAt.Equal(T0.Add(TTL)) || c.Turn.Prompt == "" || len(c.Turn.AgentCommand) != 2 {
			t.Fatalf("turn %d: %+v", i, c)
		}
		ev := f.events(c.JobID, "claimed")
		if len(ev) != 1 || ev[0].AttemptID != c.AttemptID || !jsonHas(ev[0].Data, "lease_owner", "host-a") {
			t.Fatalf("turn %d: claimed events %+v", i, ev)
		}
		if _, err := st.Renew(f.ctx, ref(c), TTL, at(time.Second)); err != nil {
			t.Fatalf("turn %d: renew: %v", i, err)
		}
	}
	if cs, err := st.ClaimMany(f.ctx, p); err != nil || len(cs) != 0 {
		t.Fatalf("ClaimMany with every head running = %d turns, %v; want none", len(cs), err)
	}
}

// testRaceManyBatchedClaimers: batched claimers racing take each turn
// once, each conversation's turns one at a time.
func testRaceManyBatchedClaimers(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	const convs, workers, slots = 60, 4, 5
	for range convs {
		f.enqueue(f.conversation().ID, "turn")
	}
	var (
		mu      sync.Mutex
		claimed = map[string]int{}
		wg      sync.WaitGroup
		errs    []error
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				p := store.ClaimParams{HostID: f.host.ID, LeaseTTL: TTL, WorkerTokenHash: Hash(fmt.Sprintf("b-%d-%d-0", w, i)), Now: T0}
				for k := 1; k < slots; k++ {
					p.More = append(p.More, store.ClaimSlot{WorkerTokenHash: Hash(fmt.Sprintf("b-%d-%d-%d", w, i, k))})
				}
				cs, err := st.ClaimMany(f.ctx, p)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				}
				for _, c := range cs {
					claimed[c.JobID]++
				}
				n := len(claimed)
				mu.Unlock()
				if err != nil || (len(cs) == 0 && n == convs) {
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatal(errs[0])
	}
	for id, n := range claimed {
		if n != 1 {
			t.Errorf("job %s claimed %d times", id, n)
		}
	}
	if len(claimed) != convs {
		t.Fatalf("%d jobs claimed, want %d", len(claimed), convs)
	}
}

// jsonHas reports whether the JSON object data holds key with the string value want.
func jsonHas(data json.RawMessage, key, want string) bool {
	var m map[string]any
	if json.Unmarshal(data, &m) != nil {
		return false
	}
	v, ok := m[key].(string)
	return ok && v == want
}
