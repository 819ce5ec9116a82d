package integration

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// TestLaunchFailuresPauseClaiming gives the daemon a conversation whose
// agent does not exist, so that every turn child declines in its read-only
// preflight and the daemon releases the claim (R33). Three declines in a
// row pause claiming (R37): the fourth claim comes only after the launch
// backoff, while Admin → Servers shows launch_error beside the host. Once
// the broken turn is cancelled, a good launch clears launch_error.
func TestLaunchFailuresPauseClaiming(t *testing.T) {
	t.Parallel()
	const threshold, backoff = 3, 1500 * time.Millisecond
	e := newEnv(t, envOpts{})
	e.startDaemon(func(c *fleet.DaemonConfig) {
		c.Capacity = 1
		c.LaunchFailures = threshold
		c.LaunchBackoff = backoff
		c.LaunchBackoffMax = backoff
	})

	bad, err := e.user.CreateConversation(e.ctx, "no such agent", filepath.Join(e.dir, "missing", "agent"))
	if err != nil {
		t.Fatal(err)
	}
	badJob := e.send(bad.ID, "this turn can never launch")
	srv := e.waitServer("reporting launch_error", func(s wire.Server) bool {
		return s.LaunchError != nil && s.LaunchError.Consecutive >= threshold
	})
	if srv.LaunchError.Class == "" || srv.LaunchError.Since.IsZero() {
		t.Errorf("launch_error without class or start: %+v", *srv.LaunchError)
	}

	j := e.waitJob(badJob.ID, "claimed after the pause", func(j wire.Job) bool { return len(j.Attempts) > threshold })
	for _, a := range j.Attempts[:threshold] {
		if a.State != wire.AttemptReleased {
			t.Errorf("attempt %s of a turn that never launched is %s, want released", a.ID, a.State)
		}
	}
	if j.AttemptCount > 1 || j.State == wire.JobFailed {
		t.Errorf("released attempts must not count against the job: %s", describeJob(j))
	}
	// R37: the pause after the threshold is at least the backoff less its
	// jitter (0.2).
	last, next := j.Attempts[threshold-1], j.Attempts[threshold]
	if last.EndedAt == nil {
		t.Fatalf("released attempt without an end: %s", describeJob(j))
	}
	if gap := next.ClaimedAt.Sub(*last.EndedAt); gap < backoff*8/10-10*time.Millisecond {
		t.Errorf("claiming resumed %v after the %d-th launch failure, before the %v backoff", gap, threshold, backoff)
	}
	for i := 1; i < threshold; i++ {
		if gap := j.Attempts[i].ClaimedAt.Sub(*j.Attempts[i-1].EndedAt); gap > backoff/2 {
			t.Logf("note: claim %d came %v after the release before it (no pause expected below the threshold)", i+1, gap)
		}
	}

	if _, err := e.user.Cancel(e.ctx, badJob.ID); err != nil {
		t.Fatal(err)
	}
	if j := e.waitEnded(badJob.ID); j.State != wire.JobCancelled {
		t.Errorf("the broken turn after cancel: %s", describeJob(j))
	}
	good := e.conversation("good")
	if j := e.waitEnded(e.send(good.ID, "a turn that launches").ID); j.State != wire.JobSucceeded {
		t.Fatalf("good turn: %s", describeJob(j))
	}
	e.waitServer("clear of launch_error after a good launch", func(s wire.Server) bool { return s.LaunchError == nil })
}
