package integration

import (
	"bytes"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// TestSIGTERMHandsTurnOver (P5): a plain SIGTERM, outside systemd, during
// an admitted turn that is silent until the test lets it end. The daemon stops claiming,
// leaves the turn running and exits 0 at once — while the turn's agent
// still runs, long before the turn could have ended — saying how many turns
// it handed over. The turn child waits on its re-attach socket; the next
// start re-attaches it (runnerd_turn_reattached) and the turn ends as if
// nothing had happened: one attempt, no worker loss, the prompt once, the
// conversation usable, and its next message on the same supervisor.
func TestSIGTERMHandsTurnOver(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	d := e.startDaemon(func(c *fleet.DaemonConfig) { c.LeaseTTL = reattachLease })
	c := e.conversation("handed over")
	const prompt = "a turn through a stop\n!events 1\n!await go-on\n!events 1"
	j := e.send(c.ID, prompt)
	e.waitPrompts(c.ID, 1)
	agents, children := e.agents(c.ID), e.turnChildren()
	if len(agents) != 1 || len(children) != 1 {
		t.Fatalf("want one agent and one turn child; got %v and %v", agents, children)
	}
	sup, err := fleet.SupervisorPid(e.stateDir, c.ID)
	if err != nil {
		t.Fatal(err)
	}

	d.Signal(syscall.SIGTERM)
	if err := d.Wait(waitFor); err != nil {
		t.Fatal(err)
	}
	if code := d.ExitCode(); code != 0 {
		t.Errorf("runnerd exited %d after SIGTERM, want 0", code)
	}
	// It did not wait for the turn: the agent and the child still run, the
	// attempt is still running, nothing was reported.
	if !alive(agents[0].Pid) || !alive(children[0].Pid) {
		t.Fatalf("the turn did not outlive the stop: agent alive %v, child alive %v", alive(agents[0].Pid), alive(children[0].Pid))
	}
	if got := e.job(j.ID); got.State != wire.JobRunning || len(got.Attempts) != 1 || got.Attempts[0].State != wire.AttemptRunning {
		t.Fatalf("after the handover: %s", describeJob(got))
	}
	out := d.Output()
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`"msg":"runnerd_handover_started","running":1`),
		regexp.MustCompile(`"msg":"runnerd_turn_handed_over","job_id":"` + j.ID + `"`),
		regexp.MustCompile(`"msg":"runnerd_stopped","handover":true,"handed_over":1,"unanswered":0`),
	} {
		if !want.MatchString(out) {
			t.Errorf("no %s in the daemon's records", want)
		}
	}
	if strings.Contains(out, `"msg":"runnerd_turn_stopped"`) || strings.Contains(out, `"msg":"runnerd_drain_started"`) {
		t.Errorf("the stop stopped a turn or drained")
	}

	d = e.restart(d)
	assertReattached(t, d, 0, j.ID)
	e.release(c.ID, "go-on")
	e.assertCompletedOnce(j.ID, c.ID, 1)
	e.assertPromptsOnce(c.ID, prompt)
	if next := e.waitEnded(e.send(c.ID, "after the handover").ID); next.State != wire.JobSucceeded {
		t.Fatalf("the message after the handover: %s", describeJob(next))
	}
	e.assertPromptsOnce(c.ID, prompt, "after the handover")
	if now, err := fleet.SupervisorPid(e.stateDir, c.ID); err != nil || now != sup {
		t.Errorf("the supervisor is %d (%v) after the handover, want the same %d", now, err, sup)
	}
}

// drain runs `runnerd drain` on the test's state directory, as an operator
// would; the returned wait gives its output once it has exited (after the
// daemon, which it waits for) and fails the test unless it exited 0.
func (e *env) drain(d *fleet.Daemon) (wait func() string) {
	e.t.Helper()
	var out bytes.Buffer
	cmd := exec.CommandContext(e.ctx, e.runnerd, "drain", "--state-dir", e.stateDir)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	return func() string {
		e.t.Helper()
		if err := cmd.Wait(); err != nil {
			e.t.Errorf("runnerd drain: %v\n%s", err, out.String())
		}
		return out.String()
	}
}
