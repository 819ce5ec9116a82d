package integration

import (
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// TestControlPlaneRestartMidTurn stops the control plane in the middle of
// a silent turn and starts it again on the same database and address
// within the lease. Renewals fail while it is away and are retried every
// retry delay while the lease can still be valid (R4); the first answer
// after its return restores the normal cadence (R7, agent_heartbeat_recovered);
// the turn succeeds on its one attempt and its prompt reached the agent once.
func TestControlPlaneRestartMidTurn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	// A lease long enough for a control-plane restart on a loaded machine.
	const lease = 4 * time.Second
	d := e.startDaemon(func(c *fleet.DaemonConfig) { c.LeaseTTL = lease })

	c := e.conversation("outage")
	prompt := fmt.Sprintf("keep going\n!silent %v\n!events 1", 2*time.Second)
	j := e.send(c.ID, prompt)
	e.waitPrompts(c.ID, 1)

	stoppedAt, mark := time.Now(), d.Mark()
	if err := e.cp.Stop(syscall.SIGTERM, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// Away until the daemon has retried a renewal twice (R4).
	if _, err := d.AwaitOutput(mark, secondRetry, waitFor); err != nil {
		t.Fatal(err)
	}
	cfg := e.cp.Config()
	cfg.Listen = strings.TrimPrefix(e.cp.URL, "http://")
	cp, err := fleet.StartControlPlane(e.ctx, cfg)
	if err != nil {
		t.Fatalf("restart the control plane: %v", err)
	}
	t.Cleanup(func() { _ = cp.Stop(syscall.SIGTERM, 15*time.Second); cp.User.Close() })
	back := time.Since(stoppedAt)
	e.cp, e.user = cp, cp.User

	got := e.waitEnded(j.ID)
	if got.State != wire.JobSucceeded || len(got.Attempts) != 1 {
		t.Fatalf("want the turn to succeed on its one attempt across a %v control-plane restart; got %s", back, describeJob(got))
	}
	out := d.Output()
	for _, rec := range []string{`"msg":"agent_heartbeat_retry"`, `"msg":"agent_heartbeat_recovered"`} {
		if !strings.Contains(out, rec) {
			t.Errorf("no %s record in the daemon's output", rec)
		}
	}
	e.assertPromptsOnce(c.ID, prompt)
}

var secondRetry = regexp.MustCompile(`"msg":"agent_heartbeat_retry".*"consecutive_failures":[2-9]`)

// TestExecutionTimeout bounds a turn whose agent never ends with a short
// --exec-timeout (R5). The lease stays renewed meanwhile; the turn is
// reported failed with the execution_timeout class and a distinct
// agent_execution_timeout record (R18); the prompt was admitted and the
// turn unsettled, so the conversation is quarantined (K13) rather than the prompt
// replayed (R30).
func TestExecutionTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	// Outlives several leases (renewal goes on meanwhile), and leaves a
	// loaded machine time to bring the prompt to the agent: the deadline
	// counts from the launch, preparation included (K6).
	const limit = 4 * leaseTTL
	d := e.startDaemon(func(c *fleet.DaemonConfig) { c.ExecTimeout = limit })

	c := e.conversation("timeout")
	const prompt = "never ends\n!hang"
	j := e.waitEnded(e.send(c.ID, prompt).ID)
	if j.State != wire.JobFailed || len(j.Attempts) != 1 || j.Attempts[0].State != wire.AttemptFinished {
		t.Fatalf("want failed on its one attempt, reported by the runner; got %s", describeJob(j))
	}
	a := j.Attempts[0]
	fin, _ := findEvent(j, a.ID, "finished")
	if !strings.Contains(string(fin.Data), "execution_timeout") {
		t.Errorf("the terminal report does not name the execution timeout: %s", fin.Data)
	}
	if took := fin.Time.Sub(a.ClaimedAt); took < limit {
		t.Errorf("the turn was ended %v after its claim, before the %v execution timeout", took, limit)
	}
	if !strings.Contains(d.Output(), `"msg":"agent_execution_timeout"`) {
		t.Errorf("no agent_execution_timeout record in the output")
	}
	// K13: admitted and unsettled, so quarantined, not lost; the prompt
	// reached the agent once and is never sent again.
	if conv := e.conv(c.ID); conv.State != wire.ConversationQuarantined || conv.InterruptedJobID != j.ID {
		t.Errorf("conversation is %s, want quarantined", conv.State)
	}
	e.assertPromptsOnce(c.ID, prompt)
}
