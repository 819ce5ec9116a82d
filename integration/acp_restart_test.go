package integration

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// acpDemoConversation is a conversation of the demo agent over ACP.
func (e *env) acpDemoConversation(title string) wire.Conversation {
	e.t.Helper()
	c, err := e.user.Create(e.ctx, wire.CreateConversationRequest{Title: title, Image: "demo",
		AgentCommand: []string{bins.DemoAgent, "--acp"}, AgentProtocol: wire.AgentProtocolACP, PermissionPolicy: wire.PermissionAllow})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// saidTurn: the ACP demo agent said "turn N" in the job's events — its
// session counted the prompt.
func saidTurn(n string) func(wire.Job) bool {
	return func(j wire.Job) bool { return slices.Contains(strings.Split(runnerTexts(j), "\n"), "turn "+n) }
}

// demoSession is the session id the ACP demo agent keeps in its workspace.
func (e *env) demoSession(convID string) string {
	e.t.Helper()
	b, err := os.ReadFile(filepath.Join(fleet.Workspace(e.stateDir, convID), ".demoagent", "acp_session"))
	if err != nil {
		e.t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// A6, K13 with the demo agent over ACP: the supervisor is killed while an
// admitted turn runs (its agent, whose parent it was, dies with it). The
// conversation is quarantined; the next message starts a new supervisor
// and a new agent, which session/loads the kept session (the agent's own
// session id is unchanged: no session/new) and continues it: the agent
// counts the message its third. Every prompt reached the agent exactly
// once.
func TestACPSupervisorKilledMidTurnResumesBySessionLoad(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.startDaemon(nil)
	c := e.acpDemoConversation("acp supervisor killed mid-turn")
	if j := e.waitEnded(e.send(c.ID, "a settled turn").ID); j.State != wire.JobSucceeded {
		t.Fatalf("turn 1: %s", describeJob(j))
	}
	session := e.demoSession(c.ID)
	const killed = "a turn whose supervisor dies\n!sleep 10m"
	j := e.send(c.ID, killed)
	e.waitJob(j.ID, "the agent to count the turn", saidTurn("2"))
	agents := agentsOf(e, c.ID, bins.DemoAgent)
	sup, err := fleet.SupervisorPid(e.stateDir, c.ID)
	if err != nil || !alive(sup) || len(agents) != 1 {
		t.Fatalf("the conversation's supervisor %d (%v) and agents %v", sup, err, agents)
	}
	stopSupervisor(t, sup)
	e.quarantined(c.ID, j.ID)
	const after = "the message after it"
	r := e.waitEnded(e.send(c.ID, after).ID)
	if _, ok := findEvent(r, "", "conversation_resumed"); r.State != wire.JobSucceeded || len(r.Attempts) != 1 || !ok {
		t.Fatalf("the message after the interruption: want succeeded on a verified boundary: %s", describeJob(r))
	}
	// The loaded session holds the killed turn: the agent counts this one
	// its third. The conversation's native turn is runnerd's own count for
	// an ACP agent (which reports none): the turns whose end the supervisor
	// saw, and this one.
	if !saidTurn("3")(r) {
		t.Fatalf("the resumed session does not continue the agent's history: %q", runnerTexts(r))
	}
	if cv := e.conv(c.ID); cv.State != wire.ConversationUsable || cv.NativeTurn != 2 || cv.InterruptedJobID != "" {
		t.Fatalf("conversation after the resume: %s at native turn %d (interrupted %q), want usable at 2", cv.State, cv.NativeTurn, cv.InterruptedJobID)
	}
	now := agentsOf(e, c.ID, bins.DemoAgent)
	if len(now) != 1 || now[0].Pid == agents[0].Pid {
		t.Fatalf("agents %v after the resume, want one new process (was %d)", now, agents[0].Pid)
	}
	if got := e.demoSession(c.ID); got != session {
		t.Fatalf("the agent's session is %s after the resume, was %s: a new session, not a loaded one", got, session)
	}
	e.assertPromptsOnce(c.ID, "a settled turn", killed, after)
}

// P5 with the demo agent over ACP: the daemon is killed (SIGKILL) while an
// admitted ACP turn runs; the turn child outlives it, the restarted daemon
// re-attaches to it, and the turn completes on its one attempt, on the
// same agent process and session; the next turn runs on them too.
func TestACPDaemonRestartedMidTurnReattaches(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	d := e.startDaemon(func(c *fleet.DaemonConfig) { c.LeaseTTL = 5 * time.Second })
	c := e.acpDemoConversation("acp daemon restarted mid-turn")
	if j := e.waitEnded(e.send(c.ID, "first").ID); j.State != wire.JobSucceeded {
		t.Fatalf("turn 1: %s", describeJob(j))
	}
	agents := agentsOf(e, c.ID, bins.DemoAgent)
	if len(agents) != 1 {
		t.Fatalf("agents %v, want the conversation's one kept agent", agents)
	}
	const long = "a long turn the restart does not cut short\n!sleep 8s"
	j := e.send(c.ID, long)
	e.waitJob(j.ID, "the agent to count the turn", saidTurn("2"))
	d.Signal(syscall.SIGKILL)
	if err := d.Wait(waitFor); err != nil {
		t.Fatal(err)
	}
	if !alive(agents[0].Pid) {
		t.Fatal("the agent died with the daemon")
	}
	e.restart(d)
	got := e.waitEnded(j.ID)
	if got.State != wire.JobSucceeded || got.AttemptCount != 1 || got.WorkerLostCount != 0 || !strings.Contains(runnerTexts(got), "echo: a long turn") {
		t.Fatalf("the re-attached turn: want succeeded after one attempt with the agent's reply; got %s", describeJob(got))
	}
	if j := e.waitEnded(e.send(c.ID, "third").ID); j.State != wire.JobSucceeded || !saidTurn("3")(j) {
		t.Fatalf("turn 3: %s", describeJob(j))
	}
	if now := agentsOf(e, c.ID, bins.DemoAgent); len(now) != 1 || now[0].Pid != agents[0].Pid {
		t.Fatalf("agents %v, want the same process %d throughout", now, agents[0].Pid)
	}
	if cv := e.conv(c.ID); cv.State != wire.ConversationUsable || cv.NativeTurn != 3 {
		t.Fatalf("conversation %s at native turn %d, want usable at 3", cv.State, cv.NativeTurn)
	}
	e.assertPromptsOnce(c.ID, "first", long, "third")
}

// Bad input before admission, end to end: an ACP agent that never answers
// initialize fails its turn before admission with class
// agent_unresponsive (after the supervisor's 30 s bound), one that exits
// during initialize with agent_start_failed; neither prompt was admitted,
// and each conversation stays usable, not quarantined or lost.
func TestACPAgentBadAtInitializeLeavesConversationUsable(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.startDaemon(nil)
	for _, c := range []struct{ flag, class string }{{"--init=hang", "agent_unresponsive"}, {"--init=exit", "agent_start_failed"}} {
		cv, err := e.user.Create(e.ctx, wire.CreateConversationRequest{Title: "acp " + c.flag, Image: "demo",
			AgentCommand: []string{bins.DemoAgent, "--acp", c.flag}, AgentProtocol: wire.AgentProtocolACP})
		if err != nil {
			t.Fatal(err)
		}
		j := e.waitEnded(e.send(cv.ID, "never admitted").ID)
		if j.State != wire.JobFailed || !hasFinishClass(j, c.class) || len(j.Attempts) != 1 {
			t.Fatalf("%s: want failed on one attempt with class %s: %s", c.flag, c.class, describeJob(j))
		}
		if _, ok := findEvent(j, "", "admitted"); ok {
			t.Fatalf("%s: the turn was admitted: %s", c.flag, describeJob(j))
		}
		if got := e.conv(cv.ID); got.State != wire.ConversationUsable || got.NativeTurn != 0 {
			t.Fatalf("%s: conversation %s at native turn %d, want usable at 0", c.flag, got.State, got.NativeTurn)
		}
	}
}
