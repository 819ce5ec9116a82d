package storetest

import (
	"fmt"
	"strings"
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
