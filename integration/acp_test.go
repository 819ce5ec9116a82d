package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

var exampleAgent struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// acpExampleAgent builds the ACP SDK's own example agent from the module
// cache, once: an ACP agent this project did not write.
func acpExampleAgent(t *testing.T) string {
	t.Helper()
	exampleAgent.once.Do(func() {
		exampleAgent.dir, exampleAgent.err = os.MkdirTemp("", "runnerd-acp-example-")
		if exampleAgent.err != nil {
			return
		}
		out := filepath.Join(exampleAgent.dir, "acp-example-agent")
		cmd := exec.Command("go", "build", "-trimpath", "-o", out, "github.com/coder/acp-go-sdk/example/agent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			exampleAgent.err = err
			t.Logf("%s", b)
			return
		}
		exampleAgent.path = out
	})
	if exampleAgent.err != nil {
		t.Fatalf("build the ACP example agent: %v", exampleAgent.err)
	}
	return exampleAgent.path
}

func runnerTypes(j wire.Job) []string {
	var out []string
	for _, ev := range j.Events {
		if ev.Source == "runner" {
			out = append(out, ev.Type)
		}
	}
	return out
}

// runnerTexts are the texts of the job's agent_message_chunk events.
func runnerTexts(j wire.Job) string {
	var b strings.Builder
	for _, ev := range j.Events {
		if ev.Source != "runner" || ev.Type != "agent_message_chunk" {
			continue
		}
		var u struct {
			Content struct {
				Text string `json:"text"`
			} `json:"content"`
		}
		if json.Unmarshal(ev.Data, &u) == nil {
			b.WriteString(u.Content.Text + "\n")
		}
	}
	return b.String()
}

// A1–A4 end to end on the process backend, against the SDK's example
// agent: a conversation of agent_protocol acp; each turn's session/updates
// are its job's events, of their ACP kinds; its permission request is
// answered by the conversation's policy (allow); the agent process is kept
// across turns; a cancel mid-turn ends the job cancelled with the
// conversation usable, and the next message runs on the same agent and
// session.
func TestACPExampleAgentConversation(t *testing.T) {
	t.Parallel()
	agent := acpExampleAgent(t)
	e := newEnv(t, envOpts{})
	e.startDaemon(nil)
	c, err := e.user.Create(e.ctx, wire.CreateConversationRequest{Title: "acp", Image: "demo", AgentCommand: []string{agent},
		AgentProtocol: wire.AgentProtocolACP, PermissionPolicy: wire.PermissionAllow})
	if err != nil {
		t.Fatal(err)
	}
	j := e.waitEnded(e.send(c.ID, "hello").ID)
	if j.State != wire.JobSucceeded {
		t.Fatalf("turn 1: %s", describeJob(j))
	}
	types := runnerTypes(j)
	for _, want := range []string{"agent_message_chunk", "tool_call", "tool_call_update", "permission_requested", "permission_answered", "stop_reason"} {
		if !slices.Contains(types, want) {
			t.Fatalf("turn 1 events %v lack %s", types, want)
		}
	}
	if !strings.Contains(runnerTexts(j), "successfully updated the configuration") {
		t.Fatalf("the allow policy did not reach the agent: %q", runnerTexts(j))
	}
	agents := agentsOf(e, c.ID, agent)
	if len(agents) != 1 {
		t.Fatalf("want the conversation's one agent kept after its turn, got %v", agents)
	}

	// A cancel once the turn streams: session/cancel, the agent's own
	// "cancelled", a settled interrupted boundary.
	j3 := e.send(c.ID, "to be cancelled")
	e.waitJob(j3.ID, "to stream", func(j wire.Job) bool { return slices.Contains(runnerTypes(j), "agent_message_chunk") })
	if _, err := e.user.Cancel(e.ctx, j3.ID); err != nil {
		t.Fatal(err)
	}
	got := e.waitEnded(j3.ID)
	if got.State != wire.JobCancelled || !strings.Contains(got.Reason, "interrupted at your request") {
		t.Fatalf("cancelled turn: %s", describeJob(got))
	}
	if cv := e.conv(c.ID); cv.State != wire.ConversationUsable || cv.NativeTurn != 2 {
		t.Fatalf("after the cancel: %s at native turn %d, want usable at 2", cv.State, cv.NativeTurn)
	}
	j4 := e.waitEnded(e.send(c.ID, "after the cancel").ID)
	if j4.State != wire.JobSucceeded {
		t.Fatalf("turn after the cancel: %s", describeJob(j4))
	}
	if now := agentsOf(e, c.ID, agent); len(now) != 1 || now[0].Pid != agents[0].Pid {
		t.Fatalf("agents %v after the cancel, want the same process %d and its session", now, agents[0].Pid)
	}
	if cv := e.conv(c.ID); cv.NativeTurn != 3 {
		t.Fatalf("native turn %d, want 3", cv.NativeTurn)
	}
}

// A2, A6 end to end with the demo agent over ACP: every prompt reaches it
// exactly once; its process gone (it crashed), the next turn loads the
// kept session into a new process; without loadSession, the conversation
// is unrecoverable with class acp_session_not_loadable and the prompt is
// never sent.
func TestACPDemoAgentResumeAndNotLoadable(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.startDaemon(nil)
	create := func(argv ...string) wire.Conversation {
		c, err := e.user.Create(e.ctx, wire.CreateConversationRequest{Title: "acp demo", Image: "demo",
			AgentCommand: append([]string{bins.DemoAgent, "--acp"}, argv...), AgentProtocol: wire.AgentProtocolACP})
		if err != nil {
			t.Fatal(err)
		}
		if c.PermissionPolicy != wire.PermissionAsk {
			t.Fatalf("policy %q, want ask by default", c.PermissionPolicy)
		}
		return c
	}
	c := create()
	for _, p := range []string{"hello", "!crash", "after the crash"} {
		e.waitEnded(e.send(c.ID, p).ID)
	}
	e.assertPromptsOnce(c.ID, "hello", "!crash", "after the crash")
	if cv := e.conv(c.ID); cv.State != wire.ConversationUsable || cv.NativeTurn != 3 {
		t.Fatalf("resumed conversation: %s at %d", cv.State, cv.NativeTurn)
	}

	n := create("--no-load-session")
	e.waitEnded(e.send(n.ID, "hello").ID)
	e.waitEnded(e.send(n.ID, "!crash").ID)
	e.assertPromptsOnce(n.ID, "hello", "!crash")
	j := e.waitEnded(e.send(n.ID, "never sent").ID)
	if j.State != wire.JobFailed || !hasFinishClass(j, "acp_session_not_loadable") {
		t.Fatalf("want failed with acp_session_not_loadable: %s", describeJob(j))
	}
	if cv := e.conv(n.ID); cv.State != wire.ConversationLost {
		t.Fatalf("conversation %s, want lost (unrecoverable)", cv.State)
	}
	// The daemon removes a LOST conversation's sandbox, transcript and
	// all: the job's one attempt, never admitted, is the proof that the
	// prompt was not sent.
	if len(j.Attempts) != 1 || slices.ContainsFunc(j.Events, func(ev wire.JobEvent) bool { return ev.Type == "admitted" }) {
		t.Fatalf("the unloadable turn was admitted or tried again: %s", describeJob(j))
	}
}

func hasFinishClass(j wire.Job, class string) bool {
	for _, ev := range j.Events {
		if ev.Source == "control" && strings.Contains(string(ev.Data), `"class":"`+class+`"`) {
			return true
		}
	}
	return strings.Contains(j.Reason, class)
}

// agentsOf are the live processes of program in the conversation's workspace.
func agentsOf(e *env, convID, program string) []proc {
	var out []proc
	ws := fleet.Workspace(e.stateDir, convID)
	for _, p := range e.procs() {
		if p.Argv[0] == program && (p.Cwd == ws || strings.HasPrefix(p.Cwd, ws+"/")) {
			out = append(out, p)
		}
	}
	return out
}
