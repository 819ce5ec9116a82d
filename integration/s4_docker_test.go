package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// TestS4MissingImageNeverPausesHostDocker is S4 on the Docker backend
// against the real engine: under --pull never, turns whose conversation
// names an image this host does not have decline in the preflight
// (image_unavailable) beside
// turns of a present image, on a host whose claiming would pause ten
// minutes after one launch failure. The healthy turns all succeed on this
// host meanwhile; the broken job fails past the release cap naming
// image_unavailable, its conversation usable; no launch_error.
func TestS4MissingImageNeverPausesHostDocker(t *testing.T) {
	t.Parallel()
	e := newDockerEnv(t, envOpts{}, "")
	e.startDaemon(func(c *fleet.DaemonConfig) {
		c.Sandbox = "docker"
		c.Capacity = 1
		c.LaunchFailures = 1
		c.LaunchBackoff = 10 * time.Minute
		c.LaunchBackoffMax = 10 * time.Minute
		c.Args = append(c.Args, "--sandbox-sweep", "0", "--pull", "never")
	})
	missing, err := e.user.Create(e.ctx, wire.CreateConversationRequest{Title: "no such image", Image: "runnerd-test/no-such-image:none", AgentCommand: []string{"/demoagent"}})
	if err != nil {
		t.Fatal(err)
	}
	bad := e.send(missing.ID, "this turn can never launch here")
	var good []wire.Job
	for range 2 {
		good = append(good, e.send(e.conversation("present image").ID, "hello"))
	}
	for _, j := range good {
		if j = e.waitEnded(j.ID); j.State != wire.JobSucceeded || len(j.Attempts) != 1 || j.Attempts[0].LeaseOwner != e.host {
			t.Errorf("healthy turn beside a missing image: %s", describeJob(j))
		}
	}
	if j := e.waitEnded(bad.ID); j.State != wire.JobFailed || !strings.Contains(j.Reason, "image_unavailable") {
		t.Errorf("turn of a missing image, want it failed past the release cap naming image_unavailable: %s", describeJob(j))
	}
	if cv := e.conv(missing.ID); cv.State != wire.ConversationUsable {
		t.Errorf("conversation of a missing image is %s, want usable", cv.State)
	}
	if srv, ok, err := e.user.Server(e.ctx, e.host); err != nil || !ok || srv.LaunchError != nil {
		t.Errorf("host after a missing image: %+v (found %v, %v); want no launch_error", srv, ok, err)
	}
}

// TestS4UnpullableImageFailsBeforeAdmissionDocker is S4 for a pull (the
// default --pull missing): a conversation whose image no registry serves
// (the discard port of loopback: nothing listens) fails its turn before
// admission, once, with class image_unavailable and the pull's failure on
// its timeline; the conversation stays usable, and healthy turns beside it
// run on the same host, which never pauses (no launch_error).
func TestS4UnpullableImageFailsBeforeAdmissionDocker(t *testing.T) {
	t.Parallel()
	e := newDockerEnv(t, envOpts{}, "")
	e.startDaemon(func(c *fleet.DaemonConfig) {
		c.Sandbox = "docker"
		c.Capacity = 1
		c.LaunchFailures = 1
		c.LaunchBackoff = 10 * time.Minute
		c.LaunchBackoffMax = 10 * time.Minute
		c.Args = append(c.Args, "--sandbox-sweep", "0")
	})
	unpullable, err := e.user.Create(e.ctx, wire.CreateConversationRequest{Title: "unpullable image", Image: "127.0.0.1:9/runnerd-test/nowhere:v1", AgentCommand: []string{"/demoagent"}})
	if err != nil {
		t.Fatal(err)
	}
	bad := e.send(unpullable.ID, "this image cannot be pulled")
	var good []wire.Job
	for range 2 {
		good = append(good, e.send(e.conversation("present image").ID, "hello"))
	}
	for _, j := range good {
		if j = e.waitEnded(j.ID); j.State != wire.JobSucceeded || len(j.Attempts) != 1 || j.Attempts[0].LeaseOwner != e.host {
			t.Errorf("healthy turn beside an unpullable image: %s", describeJob(j))
		}
	}
	j := e.waitEnded(bad.ID)
	if j.State != wire.JobFailed || j.Admitted || len(j.Attempts) != 1 || j.ReleaseCount != 0 || !hasEventData(j, "image_unavailable") {
		t.Errorf("turn of an unpullable image, want it failed once before admission, class image_unavailable: %s", describeJob(j))
	}
	pullFailed := 0
	for _, ev := range j.Events {
		if ev.Type == wire.EventImagePullFailed {
			pullFailed++
		}
	}
	if pullFailed != 1 {
		t.Errorf("timeline has %d %s events, want 1: %s", pullFailed, wire.EventImagePullFailed, describeJob(j))
	}
	if cv := e.conv(unpullable.ID); cv.State != wire.ConversationUsable {
		t.Errorf("conversation of an unpullable image is %s, want usable", cv.State)
	}
	if srv, ok, err := e.user.Server(e.ctx, e.host); err != nil || !ok || srv.LaunchError != nil {
		t.Errorf("host after an unpullable image: %+v (found %v, %v); want no launch_error", srv, ok, err)
	}
}

// hasEventData: some event of j carries s in its data.
func hasEventData(j wire.Job, s string) bool {
	for _, ev := range j.Events {
		if strings.Contains(string(ev.Data), s) {
			return true
		}
	}
	return false
}
