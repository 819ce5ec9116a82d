package integration

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// TestConversationLimitsDeclinedOnProcessHost: the process
// backend applies no per-conversation limit, so a conversation with limits
// that required no backend, claimed by a process host, is declined in the
// preflight (limits_unsupported), released before admission and, past the
// release cap (K7), failed naming that class — never run unlimited; its
// conversation stays usable, and the host, whose launch backoff would
// pause it for ten minutes after one launch failure, runs the next
// conversation's turn at once: the conversation's fault, not the host's.
func TestConversationLimitsDeclinedOnProcessHost(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	d := e.startDaemon(func(c *fleet.DaemonConfig) {
		c.Capacity = 1
		c.LaunchFailures = 1
		c.LaunchBackoff = 10 * time.Minute
		c.LaunchBackoffMax = 10 * time.Minute
	})
	limited, err := e.user.Create(e.ctx, wire.CreateConversationRequest{Title: "limited", Image: "demo",
		AgentCommand: []string{bins.DemoAgent}, Limits: wire.Limits{MemoryBytes: 64 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	j := e.waitEnded(e.send(limited.ID, "this turn must not run unlimited").ID)
	if j.State != wire.JobFailed || !strings.Contains(j.Reason, "limits_unsupported") || j.Admitted {
		t.Errorf("limited turn on a process host, want it failed past the release cap naming limits_unsupported, never admitted: %s", describeJob(j))
	}
	for _, a := range j.Attempts {
		if a.State != wire.AttemptReleased {
			t.Errorf("attempt %s of the declined turn is %s, want released", a.ID, a.State)
		}
	}
	if cv := e.conv(limited.ID); cv.State != wire.ConversationUsable {
		t.Errorf("the limited conversation is %s, want usable", cv.State)
	}
	if ok := e.waitEnded(e.send(e.conversation("healthy").ID, "hello").ID); ok.State != wire.JobSucceeded {
		t.Errorf("a healthy turn after the declines: %s", describeJob(ok))
	}
	if srv, ok, err := e.user.Server(e.ctx, e.host); err != nil || !ok || srv.LaunchError != nil {
		t.Errorf("host after the declines: %+v (found %v, %v); want no launch_error", srv, ok, err)
	}
	if !regexp.MustCompile(`"msg":"runnerd_turn_declined_conversation_fault".*"class":"limits_unsupported"`).MatchString(d.Output()) {
		t.Errorf("no conversation-fault record naming limits_unsupported")
	}
}
