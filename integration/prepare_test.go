package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// TestPreparationFailureIsReported breaks a conversation's sandbox so that
// the turn child accepts the turn (its read-only preflight passes) and then
// fails to prepare the sandbox, before any container is recorded or the
// job admitted. The failure is reported, not left to the reaper (R22): the
// runner's own terminal report ends the attempt as failed with the
// sandbox class, while its lease is still valid; the agent never saw the
// prompt; the conversation, which admitted nothing, stays usable; and the
// daemon's record names the error class. Once the sandbox is repaired, the
// conversation's next turn runs.
func TestPreparationFailureIsReported(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	d := e.startDaemon(nil)

	c := e.conversation("broken sandbox")
	lock := filepath.Join(fleet.SandboxDir(e.stateDir, c.ID), "lock")
	// The backend's lock file is a directory: Ensure cannot open it.
	if err := os.MkdirAll(lock, 0o700); err != nil {
		t.Fatal(err)
	}
	j := e.waitEnded(e.send(c.ID, "this turn cannot be prepared").ID)
	if j.State != wire.JobFailed || j.Admitted || len(j.Attempts) != 1 {
		t.Fatalf("want one failed, never admitted attempt; got %s", describeJob(j))
	}
	a := j.Attempts[0]
	fin, ok := findEvent(j, a.ID, "finished")
	if a.State != wire.AttemptFinished || !ok {
		t.Fatalf("the attempt was not ended by the runner's report: %s", describeJob(j))
	}
	if !strings.Contains(string(fin.Data), "sandbox_unavailable") {
		t.Errorf("the terminal report does not carry the sandbox class: %s", fin.Data)
	}
	if !fin.Time.Before(a.LeaseExpiresAt) {
		t.Errorf("the failure was reported at %s, after the lease expired at %s", fin.Time, a.LeaseExpiresAt)
	}
	if _, superseded := findEvent(j, a.ID, evSuperseded); superseded {
		t.Errorf("the reaper, not the runner, ended the attempt: %s", describeJob(j))
	}
	if tr := e.transcript(c.ID); len(tr) != 0 {
		t.Errorf("the agent received a prompt of a turn that was never admitted: %+v", tr)
	}
	if conv := e.conv(c.ID); conv.State != wire.ConversationUsable {
		t.Errorf("conversation is %s after a failure before admission, want usable", conv.State)
	}
	if out := d.Output(); !strings.Contains(out, `"agent_sandbox_unavailable"`) || !strings.Contains(out, `"error_class"`) {
		t.Errorf("no agent_sandbox_unavailable record with its error class in the daemon's output")
	}

	if err := os.Remove(lock); err != nil {
		t.Fatal(err)
	}
	const prompt = "the sandbox works again"
	if j := e.waitEnded(e.send(c.ID, prompt).ID); j.State != wire.JobSucceeded {
		t.Errorf("the next turn after the repair: %s", describeJob(j))
	}
	e.assertPromptsOnce(c.ID, prompt)
}
