package storetest

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// release releases c at now with class; it fails the test on an error.
func (f *fixture) release(c wire.Claim, class string, now time.Time) {
	f.t.Helper()
	if err := f.st.Release(f.ctx, ref(c), wire.ReleaseRequest{AttemptRef: ref(c), Class: class}, now); err != nil {
		f.t.Fatalf("Release: %v", err)
	}
}

// K7: a job whose launch keeps being declined is released at most
// DefaultMaxReleases times, each followed by a doubling release backoff in
// which nobody is given it; the next release fails it, with the last
// decline's class in its reason and on the job. Its conversation stays
// usable and its next turn runs.
func testK7ReleaseCapFailsJob(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	conv := f.conversation()
	j := f.enqueue(conv.ID, "poison")
	const class = "declined:agent_missing"
	now := T0
	for n := int64(1); n <= store.DefaultMaxReleases; n++ {
		c := f.claim(now)
		if c.JobID != j.ID {
			t.Fatalf("release %d: claimed %s", n, c.JobID)
		}
		f.release(c, class, now)
		wait := store.ReleaseBackoff(store.DefaultReleaseBackoff, n)
		got := f.job(j.ID)
		if got.State != wire.JobQueued || got.ReleaseCount != int(n) || got.ReleaseClass != class ||
			got.NotBefore == nil || !got.NotBefore.Equal(now.Add(wait)) || got.AttemptCount != 0 {
			t.Fatalf("after release %d: job = %+v", n, got)
		}
		if _, ok := f.tryClaim(f.host, now.Add(wait-time.Millisecond)); ok {
			t.Fatalf("release %d: claimed within its backoff of %v", n, wait)
		}
		now = now.Add(wait)
	}
	if w := store.ReleaseBackoff(store.DefaultReleaseBackoff, 2); w != 2*store.DefaultReleaseBackoff {
		t.Fatalf("second backoff %v does not double", w)
	}
	c := f.claim(now)
	f.release(c, class, now)
	got := f.job(j.ID)
	if got.State != wire.JobFailed || got.Outcome != wire.OutcomeFailed || got.ReleaseCount != store.DefaultMaxReleases+1 ||
		got.ReleaseClass != class || !strings.Contains(got.Reason, class) ||
		!strings.Contains(got.Reason, fmt.Sprint(store.DefaultMaxReleases+1)) || got.EndedAt == nil || got.AttemptCount != 0 {
		t.Fatalf("past the cap: job = %+v", got)
	}
	if evs := f.events(j.ID, "release_cap"); len(evs) != 1 {
		t.Fatalf("release_cap events = %+v", evs)
	}
	// The same release again is still the same release, not a new count.
	f.release(c, class, now.Add(time.Second))
	if again := f.job(j.ID); again.ReleaseCount != got.ReleaseCount || again.State != wire.JobFailed {
		t.Fatalf("the same release again: job = %+v", again)
	}
	if cv := f.conv(conv.ID); cv.State != wire.ConversationUsable {
		t.Fatalf("conversation after the cap = %+v", cv)
	}
	next := f.enqueue(conv.ID, "healthy")
	if c := f.claim(now.Add(time.Second)); c.JobID != next.ID {
		t.Fatalf("next turn: claimed %s, want %s", c.JobID, next.ID)
	}
}

// K7: a job in its release backoff does not stand in front of other
// conversations' turns: a healthy turn queued after it is claimed at once,
// while the poisoned conversation's own later turn waits behind it (one
// turn at a time, in order). Once the backoff has passed, the older job
// comes first again.
func testK7BackoffJobNotInFrontOfOthers(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	poisoned, healthy := f.conversation(), f.conversation()
	p := f.enqueue(poisoned.ID, "poison")
	pNext := f.enqueue(poisoned.ID, "after the poison")
	f.release(f.claim(T0), "spawn_failed", T0)
	h := f.enqueue(healthy.ID, "healthy")
	if c := f.claim(T0); c.JobID != h.ID {
		t.Fatalf("claimed %s beside a job in backoff, want the healthy %s", c.JobID, h.ID)
	}
	if c, ok := f.tryClaim(f.host, at(time.Second)); ok {
		t.Fatalf("claimed %s: the poisoned conversation's turns wait for its backoff", c.JobID)
	}
	if c := f.claim(at(store.DefaultReleaseBackoff)); c.JobID != p.ID {
		t.Fatalf("after the backoff: claimed %s, want %s (then %s)", c.JobID, p.ID, pNext.ID)
	}
}

// K8: the store has a cluster identity from its creation, the same on
// every read.
func testK8ClusterIdentity(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	a, err := st.ClusterID(f.ctx)
	if err != nil || a == "" {
		t.Fatalf("ClusterID = %q, %v", a, err)
	}
	f.enqueue(f.conversation().ID, "p")
	f.runTurn(T0, 1)
	if b, err := st.ClusterID(f.ctx); err != nil || b != a {
		t.Fatalf("ClusterID again = %q, %v; want %q", b, err, a)
	}
}

// keyedClaim claims on h with an idempotency key hash, the worker token
// hash standing for the one the server would derive.
func (f *fixture) keyedClaim(h store.Host, key, attemptID string, held time.Duration, now time.Time) (wire.Claim, bool) {
	f.t.Helper()
	c, ok, err := f.st.Claim(f.ctx, store.ClaimParams{HostID: h.ID, LeaseTTL: TTL, Now: now, Held: held,
		AttemptID: attemptID, KeyHash: Hash(key), WorkerTokenHash: Hash(key + attemptID)})
	if err != nil {
		f.t.Fatalf("Claim with key %s: %v", key, err)
	}
	if ok && !c.Replayed {
		f.tokens[c.AttemptID] = key + attemptID
	}
	return c, ok
}

// A claim with an idempotency key, asked again by the same
// host with the same key while its attempt runs and its lease holds, gets
// the same attempt back — job, generation, expiry, the first answer's hold
// — instead of taking another job; the job is not claimed twice. Another
// host with the same key, or the key after the attempt ended or its lease
// expired, is a new claim.
func testClaimIdempotencyKey(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	other := f.newHost("host-b")
	j1 := f.enqueue(f.conversation().ID, "first")
	j2 := f.enqueue(f.conversation().ID, "second")
	j3 := f.enqueue(f.conversation().ID, "third")

	c1, ok := f.keyedClaim(f.host, "key-1", "att_key1", 7*time.Second, T0)
	if !ok || c1.JobID != j1.ID || c1.Replayed || c1.AttemptID != "att_key1" || c1.HeldMS != 7000 {
		t.Fatalf("first keyed claim = %+v, %v", c1, ok)
	}
	again, ok := f.keyedClaim(f.host, "key-1", "att_key1b", 0, at(10*time.Second))
	if !ok || !again.Replayed || again.AttemptID != c1.AttemptID || again.JobID != c1.JobID ||
		again.LeaseGeneration != c1.LeaseGeneration || !again.LeaseExpiresAt.Equal(c1.LeaseExpiresAt) ||
		again.HeldMS != 7000 || again.LeaseTTLMS != c1.LeaseTTLMS || again.Turn.Prompt != "first" {
		t.Fatalf("the same key again = %+v, want %+v", again, c1)
	}
	if got := f.job(j1.ID); len(got.Attempts) != 1 || got.AttemptCount != 1 {
		t.Fatalf("a replay made another attempt: %+v", got)
	}
	if evs := f.events(j1.ID, "claim_replayed"); len(evs) != 1 {
		t.Fatalf("claim_replayed events = %+v", evs)
	}
	// Another host's claim with the same key is its own.
	if c, ok := f.keyedClaim(other, "key-1", "att_other", 0, at(11*time.Second)); !ok || c.Replayed || c.JobID != j2.ID {
		t.Fatalf("another host, same key = %+v, %v", c, ok)
	}
	// Once the attempt has ended, the key claims anew.
	f.admit(c1, at(12*time.Second))
	f.settle(c1, 1, at(12*time.Second))
	f.finish(c1, wire.OutcomeSucceeded, at(12*time.Second))
	c3, ok := f.keyedClaim(f.host, "key-1", "att_key1c", 0, at(13*time.Second))
	if !ok || c3.Replayed || c3.JobID != j3.ID {
		t.Fatalf("the key after its attempt ended = %+v, %v", c3, ok)
	}
	// Past the lease, no replay: the reaper's to decide, and the key is
	// taken until it has (testClaimKeyTakenPastItsLease).
	c, ok, err := st.Claim(f.ctx, store.ClaimParams{HostID: f.host.ID, LeaseTTL: TTL, Now: at(13*time.Second + TTL),
		AttemptID: "att_key1d", KeyHash: Hash("key-1"), WorkerTokenHash: Hash("key-1" + "att_key1d")})
	if ok || !errors.Is(err, store.ErrKeyTaken) {
		t.Fatalf("the key past its lease = %+v, %v, %v; want nothing, ErrKeyTaken", c, ok, err)
	}
	// Without a key, every claim is new (as before).
	if _, ok := f.tryClaim(f.host, at(14*time.Second)); ok {
		t.Fatal("a claim without a key found a job: all three are taken")
	}
}

// Claims with the same key at once (a host's retry racing its first
// request still in flight) make one attempt, which every one of them gets.
func testRaceSameClaimKey(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	for i := range 3 {
		f.enqueue(f.conversation().ID, fmt.Sprint("turn ", i))
	}
	const n = 8
	got := make([]wire.Claim, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			id := fmt.Sprintf("att_race%d", i)
			got[i], _, errs[i] = st.Claim(f.ctx, store.ClaimParams{HostID: f.host.ID, LeaseTTL: TTL, Now: T0,
				AttemptID: id, KeyHash: Hash("race-key"), WorkerTokenHash: Hash("race-key" + id)})
		})
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || got[i].AttemptID != got[0].AttemptID || got[i].JobID == "" {
			t.Fatalf("claim %d = %+v, %v; claim 0 = %+v", i, got[i], errs[i], got[0])
		}
	}
	if j := f.job(got[0].JobID); len(j.Attempts) != 1 {
		t.Fatalf("job after %d claims with one key: %+v", n, j)
	}
}

// A keyed claim asked again after its attempt's lease ran out, before the
// reaper superseded it (the host's retry, late): the key is taken by an
// attempt that runs no more, so the claim takes nothing and says so
// (ErrKeyTaken) — it neither replays an expired lease nor claims another
// job under the same key. The job behind stays queued, unclaimed; once
// the reaper has superseded the attempt the key claims anew. The same for
// a batch, every slot's key.
func testClaimKeyTakenPastItsLease(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	j1 := f.enqueue(f.conversation().ID, "first")
	c1, ok := f.keyedClaim(f.host, "key-late", "att_late1", 0, T0)
	if !ok || c1.JobID != j1.ID {
		t.Fatalf("first keyed claim = %+v, %v", c1, ok)
	}
	j2 := f.enqueue(f.conversation().ID, "second")
	j3 := f.enqueue(f.conversation().ID, "third")
	late := at(TTL + time.Second)
	_, ok, err := st.Claim(f.ctx, store.ClaimParams{HostID: f.host.ID, LeaseTTL: TTL, Now: late,
		AttemptID: "att_late2", KeyHash: Hash("key-late"), WorkerTokenHash: Hash("key-late" + "att_late2")})
	wantErr(t, "the key again past its lease, before the reaper", err, store.ErrKeyTaken)
	if ok {
		t.Fatal("the late keyed claim claimed a turn")
	}
	batch := store.ClaimParams{HostID: f.host.ID, LeaseTTL: TTL, Now: late,
		AttemptID: "att_late3", KeyHash: Hash("key-late"), WorkerTokenHash: Hash("key-late" + "att_late3"),
		More: []store.ClaimSlot{{AttemptID: "att_late4", WorkerTokenHash: Hash("key-late" + "att_late4")}}}
	cs, err := st.ClaimMany(f.ctx, batch)
	wantErr(t, "a keyed batch again past its lease", err, store.ErrKeyTaken)
	if len(cs) != 0 {
		t.Fatalf("the late keyed batch claimed %v", jobsOf(cs))
	}
	for _, j := range []wire.Job{j2, j3} {
		if got := f.job(j.ID); got.State != wire.JobQueued || len(got.Attempts) != 0 {
			t.Fatalf("job %s after the late keyed claims = %+v, want queued with no attempt", j.ID, got)
		}
	}
	if got := f.job(j1.ID); len(got.Attempts) != 1 || got.Attempts[0].State != wire.AttemptRunning {
		t.Fatalf("the key's job = %+v, want its one attempt, not superseded by a claim", got)
	}
	if _, err := st.Reap(f.ctx, store.ReapParams{Now: at(TTL + 2*time.Second), MaxWorkerLost: 3}); err != nil {
		t.Fatal(err)
	}
	c2, ok := f.keyedClaim(f.host, "key-late", "att_late5", 0, at(TTL+3*time.Second))
	if !ok || c2.Replayed || c2.AttemptID != "att_late5" {
		t.Fatalf("the key after the reaper = %+v, %v; want a new claim", c2, ok)
	}

	// A batch whose slots' attempts ran out: the same.
	b := f.claimBatch(f.host, 2, "key-batch", at(TTL+3*time.Second))
	if len(b) != 2 {
		t.Fatalf("keyed batch = %v, want 2 turns", jobsOf(b))
	}
	f.enqueue(f.conversation().ID, "fourth")
	cs, err = st.ClaimMany(f.ctx, store.ClaimParams{HostID: f.host.ID, LeaseTTL: TTL, Now: at(2*TTL + 4*time.Second),
		AttemptID: "att_late6", KeyHash: Hash("key-batch"), WorkerTokenHash: Hash("key-batch" + "att_late6"),
		More: []store.ClaimSlot{{AttemptID: "att_late7", WorkerTokenHash: Hash("key-batch" + "att_late7")}}})
	wantErr(t, "the batch's key again past its leases", err, store.ErrKeyTaken)
	if len(cs) != 0 {
		t.Fatalf("the late keyed batch claimed %v", jobsOf(cs))
	}
}
