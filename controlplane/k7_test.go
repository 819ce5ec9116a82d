package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore"
	"github.com/runnerd/runnerd/wire"
)

// K7 through the server: a conversation whose agent cannot be launched is
// declined again and again. While its job waits out its release backoff, a
// healthy turn of another conversation, queued after it, is claimed by a
// long poll at once (held_ms 0, as with no poison job at all); past the
// cap (--max-releases 2 here) the job fails, and GET /v1/jobs/{id} shows
// the count, the last decline class and a reason naming it.
func TestK7PoisonJobDoesNotDelayHealthyTurns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const maxReleases, class = 2, "declined:agent_missing"
		b := newBubble(t, sqlstore.WithMaxReleases(maxReleases))
		ctx := context.Background()
		claim := func() (wire.Claim, time.Duration) {
			t.Helper()
			start := time.Now()
			c, err := b.wc.Claim(ctx, b.hostToken, wire.ClaimRequest{WaitMS: 30_000})
			if err != nil {
				t.Fatalf("claim: %v", err)
			}
			return c, time.Since(start)
		}
		decline := func(c wire.Claim) {
			t.Helper()
			if err := b.wc.Release(ctx, c.WorkerToken, c.JobID, wire.ReleaseRequest{AttemptRef: ref(c), Class: class}); err != nil {
				t.Fatalf("release: %v", err)
			}
		}
		poison := b.enqueue(t)
		for n := int64(1); n <= maxReleases+1; n++ {
			// The poison job comes back once its backoff has passed, to a
			// long poll that waits for it.
			c, took := claim()
			if c.JobID != poison.ID || (n > 1 && took < store.ReleaseBackoff(store.DefaultReleaseBackoff, n-1)) {
				t.Fatalf("try %d: claimed %s after %v, want the poison job after its backoff", n, c.JobID, took)
			}
			decline(c)
			if n > maxReleases {
				break
			}
			healthy := b.enqueue(t)
			h, took := claim()
			if h.JobID != healthy.ID || took != 0 || h.HeldMS != 0 {
				t.Fatalf("release %d: the healthy turn's claim got %s after %v (held_ms %d), want %s at once",
					n, h.JobID, took, h.HeldMS, healthy.ID)
			}
			if _, err := b.wc.Finish(ctx, h.WorkerToken, h.JobID, wire.FinishRequest{AttemptRef: ref(h), Outcome: wire.OutcomeFailed, Class: "x"}); err != nil {
				t.Fatal(err)
			}
		}
		var j wire.Job
		if _, err := b.wc.Do(ctx, "GET", "/v1/jobs/"+poison.ID, b.userToken, nil, &j); err != nil {
			t.Fatal(err)
		}
		if j.State != wire.JobFailed || j.ReleaseCount != maxReleases+1 || j.ReleaseClass != class || !strings.Contains(j.Reason, class) {
			t.Fatalf("the poison job past the cap: %+v", j)
		}
	})
}
