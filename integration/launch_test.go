package integration

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// TestLaunchFailuresPauseClaiming breaks the host itself: the turn
// executable the daemon chose at start (its runnerd-child) is moved away,
// so that every turn child fails to spawn and the daemon releases the
// claim (R33). Three failures in a row pause claiming (R37): the fourth
// claim comes only after the launch backoff, while Admin → Servers shows
// launch_error beside the host. Once the executable is back and the broken
// turn cancelled, a good launch clears launch_error. (A conversation's own
// fault, such as a missing agent, never pauses a host: S4,
// TestS4ConversationFaultsNeverPauseHost.)
func TestLaunchFailuresPauseClaiming(t *testing.T) {
	t.Parallel()
	const threshold, backoff = 3, 1500 * time.Millisecond
	e := newEnv(t, envOpts{leanChild: true})
	d := e.startDaemon(func(c *fleet.DaemonConfig) {
		c.Capacity = 1
		c.LaunchFailures = threshold
		c.LaunchBackoff = backoff
		c.LaunchBackoffMax = backoff
	})

	// The daemon chooses its turn executable at start: once it has said
	// so, take it away.
	if _, err := d.AwaitOutput(0, regexp.MustCompile(`"msg":"runnerd_turn_executable".*"path":"`+regexp.QuoteMeta(e.child)+`"`), waitFor); err != nil {
		t.Fatal(err)
	}
	away := e.child + ".away" // renamed, not chmod-ed: the file may be a link shared with other tests
	if err := os.Rename(e.child, away); err != nil {
		t.Fatal(err)
	}
	badJob := e.send(e.conversation("a host that cannot spawn").ID, "this turn cannot launch on this host")
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

	if err := os.Rename(away, e.child); err != nil {
		t.Fatal(err)
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

// TestS4ConversationFaultsNeverPauseHost: a stream of turns whose
// conversations' agent commands do not exist, beside healthy turns, on one
// host whose launch backoff would pause claiming for ten minutes after a
// single launch failure. Each broken turn declines in its preflight
// (agent_command_missing), is released and, past the control plane's
// release cap (K7), fails with that class — its conversation still usable;
// the healthy turns all run on the same host meanwhile, one attempt each,
// with no pause: no runnerd_launch_failed record, no launch_error, one
// runnerd_turn_declined_conversation_fault record per decline (S4).
func TestS4ConversationFaultsNeverPauseHost(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	d := e.startDaemon(func(c *fleet.DaemonConfig) {
		c.Capacity = 1
		c.LaunchFailures = 1
		c.LaunchBackoff = 10 * time.Minute
		c.LaunchBackoffMax = 10 * time.Minute
	})
	var bad, good []wire.Job
	for i := range 3 {
		cv, err := e.user.CreateConversation(e.ctx, "no such agent", filepath.Join(e.dir, "missing", "agent"))
		if err != nil {
			t.Fatal(err)
		}
		bad = append(bad, e.send(cv.ID, "this turn can never launch"))
		good = append(good, e.send(e.conversation("healthy").ID, "a healthy turn "+string(rune('a'+i))))
	}
	for _, j := range good {
		j = e.waitEnded(j.ID)
		if j.State != wire.JobSucceeded || len(j.Attempts) != 1 || j.Attempts[0].LeaseOwner != e.host {
			t.Errorf("healthy turn beside broken ones, want it to succeed at once on %s: %s", e.host, describeJob(j))
		}
	}
	for _, j := range bad {
		j = e.waitEnded(j.ID)
		if j.State != wire.JobFailed || !strings.Contains(j.Reason, "agent_command_missing") {
			t.Errorf("broken turn, want it failed past the release cap naming its class: %s", describeJob(j))
		}
		for _, a := range j.Attempts {
			if a.State != wire.AttemptReleased {
				t.Errorf("attempt %s of a turn that never launched is %s, want released", a.ID, a.State)
			}
		}
		if cv := e.conv(j.ConversationID); cv.State != wire.ConversationUsable {
			t.Errorf("conversation %s of a declined turn is %s, want usable", cv.ID, cv.State)
		}
	}
	if srv, ok, err := e.user.Server(e.ctx, e.host); err != nil || !ok || srv.LaunchError != nil || srv.ClaimsWithheld != "" {
		t.Errorf("host after conversation faults: %+v (found %v, %v); want no launch_error and claims not withheld", srv, ok, err)
	}
	out := d.Output()
	if n := len(regexp.MustCompile(`"msg":"runnerd_launch_failed"`).FindAllString(out, -1)); n != 0 {
		t.Errorf("%d runnerd_launch_failed records for conversation faults, want none", n)
	}
	if n := len(regexp.MustCompile(`"msg":"runnerd_turn_declined_conversation_fault".*"class":"agent_command_missing"`).FindAllString(out, -1)); n < len(bad) {
		t.Errorf("%d conversation-fault records, want at least one per broken turn (%d)", n, len(bad))
	}
}
