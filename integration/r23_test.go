package integration

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runnerd/runnerd/wire"
)

// TestR23NoticeFailureDoesNotFailTheTurn runs a turn through the real turn
// child — its drive(), the process backend's real supervisor and the demo
// agent — with every shared_workspace_settled notice answered 500 by a
// proxy in front of the control plane. The notice is tried again under the
// report policy (K1) for at most a lease and recorded by class and status;
// after supervisor and control-plane settlement both succeeded, its failure
// does not fail the turn (R23): the job succeeds, the conversation stays
// usable and takes its next turn, whose prompt reaches the agent once.
func TestR23NoticeFailureDoesNotFailTheTurn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{faults: true})
	e.faults.refuse(wire.OpNotices, http.StatusInternalServerError)
	e.startDaemon(nil)
	c := e.conversation("notice refused")
	j := e.waitEnded(e.send(c.ID, "first").ID)
	if j.State != wire.JobSucceeded {
		t.Fatalf("job: %s, want succeeded although the notice failed", describeJob(j))
	}
	notices := e.faults.calls(j.ID, wire.OpNotices)
	if len(notices) < 2 {
		t.Errorf("%d notice tries, want the notice tried again (K1)", len(notices))
	}
	for _, n := range notices {
		if !n.refused {
			t.Errorf("a notice reached the control plane: %+v", n)
		}
	}
	if len(e.faults.calls(j.ID, wire.OpSettlement)) == 0 || len(e.faults.calls(j.ID, wire.OpFinish)) == 0 {
		t.Fatalf("settlement or finish never sent: %s", describeJob(j))
	}
	if conv := e.conv(c.ID); conv.State != wire.ConversationUsable {
		t.Fatalf("conversation %s (%s), want usable", conv.State, conv.LostReason)
	}
	out, err := os.ReadFile(filepath.Join(e.dir, "output.log"))
	if err != nil {
		t.Fatal(err)
	}
	recorded := false
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, `"msg":"agent_control_failure"`) && strings.Contains(line, `"op":"notices"`) {
			recorded = recorded || strings.Contains(line, `"status":500`)
			if strings.Contains(line, "refused by the test's proxy") {
				t.Errorf("a failure record carries the answer's text: %s", line)
			}
		}
	}
	if !recorded {
		t.Errorf("no agent_control_failure record of the notice with status 500")
	}

	e.faults.refuse("", 0)
	j2 := e.waitEnded(e.send(c.ID, "second").ID)
	if j2.State != wire.JobSucceeded {
		t.Fatalf("next turn: %s", describeJob(j2))
	}
	e.assertPromptsOnce(c.ID, "first", "second")
}
