package integration

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/sandbox/docker"
	"github.com/runnerd/runnerd/wire"
)

// acpDockerEnv is a test env whose daemon runs the docker backend against
// the real engine, with an image built FROM scratch over the ACP SDK's
// example agent (built statically); args go to the daemon.
func acpDockerEnv(t *testing.T, tag string, args ...string) *dockerEnv {
	t.Helper()
	eng := dockerEngine(t)
	agent := acpExampleAgent(t)
	e := newEnv(t, envOpts{})
	if err := docker.BuildScratchImage(e.ctx, eng, docker.ScratchImage{
		Tag:   tag,
		Files: []docker.ImageFile{{Path: "/acp-example-agent", Source: agent, Exec: true}},
		User:  "65534:65534",
	}); err != nil {
		t.Fatal(err)
	}
	be, err := docker.New(docker.Config{Engine: eng, Host: e.host, StateDir: e.stateDir, RunnerdPath: e.runnerd})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := be.Sweep(ctx, func(string) bool { return true }); err != nil {
			t.Errorf("remove the test's containers: %v", err)
		}
	})
	e.startDaemon(func(c *fleet.DaemonConfig) {
		c.Sandbox = "docker"
		c.StopGrace = 10 * time.Second
		c.Args = append(c.Args, append([]string{"--sandbox-sweep", "0"}, args...)...)
	})
	return &dockerEnv{env: e, eng: eng, tag: tag}
}

func (e *dockerEnv) acpConversation(policy string) wire.Conversation {
	e.t.Helper()
	c, err := e.user.Create(e.ctx, wire.CreateConversationRequest{Title: "acp " + policy, Image: e.tag,
		AgentCommand: []string{"/acp-example-agent"}, AgentProtocol: wire.AgentProtocolACP, PermissionPolicy: policy})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// agentPIDs are the host pids of the example agent's processes in the
// conversation's one container.
func (e *dockerEnv) agentPIDs(convID string) []string {
	e.t.Helper()
	ids := e.containers(convID)
	if len(ids) != 1 {
		e.t.Fatalf("conversation %s has containers %v, want one", convID, ids)
	}
	top, err := e.eng.ContainerTop(e.ctx, ids[0], []string{"-o", "pid,args"})
	if err != nil {
		e.t.Fatal(err)
	}
	var pids []string
	for _, p := range top.Processes {
		if len(p) == 2 && strings.HasPrefix(p[1], "/acp-example-agent") {
			pids = append(pids, p[0])
		}
	}
	return pids
}

// A1–A4 end to end on the Docker backend against the real engine and the
// SDK's example agent, an ACP agent this project did not write, in its
// container: each turn's session/updates are its job's events, of their
// ACP kinds; its permission request is answered by the conversation's
// policy — allow and reject by the supervisor, ask by the owner over the
// user API; a cancel mid-turn ends the job cancelled with the conversation
// usable, and the next message runs on the same agent process (the same
// pid in the container) and session.
func TestACPExampleAgentDocker(t *testing.T) {
	t.Parallel()
	e := acpDockerEnv(t, "runnerd-test/acp-example:dev")
	allow, reject, ask := e.acpConversation(wire.PermissionAllow), e.acpConversation(wire.PermissionReject), e.acpConversation(wire.PermissionAsk)
	ja, jr, jq := e.send(allow.ID, "hello"), e.send(reject.ID, "hello"), e.send(ask.ID, "hello")

	asked := e.waitJob(jq.ID, "to ask for permission", func(j wire.Job) bool { return len(j.PendingPermissions) == 1 })
	req := asked.PendingPermissions[0]
	if _, err := e.user.Permit(e.ctx, jq.ID, req.RequestID, "reject"); err != nil {
		t.Fatalf("answer reject: %v", err)
	}
	for _, c := range []struct {
		name, job, text string
	}{
		{"allow", ja.ID, "successfully updated the configuration"},
		{"reject", jr.ID, "skip the configuration update"},
		{"ask", jq.ID, "skip the configuration update"},
	} {
		j := e.waitEnded(c.job)
		if j.State != wire.JobSucceeded {
			t.Fatalf("%s: %s", c.name, describeJob(j))
		}
		types := runnerTypes(j)
		for _, want := range []string{"agent_message_chunk", "tool_call", "tool_call_update", wire.EventPermissionRequested, wire.EventPermissionAnswered, "stop_reason"} {
			if !slices.Contains(types, want) {
				t.Fatalf("%s: events %v lack %s", c.name, types, want)
			}
		}
		if !strings.Contains(runnerTexts(j), c.text) {
			t.Fatalf("%s: the answer did not reach the agent: %q", c.name, runnerTexts(j))
		}
	}
	if got := e.job(jq.ID); !hasOwnerAnswer(got, req.RequestID, "reject") {
		t.Fatalf("ask: no permission_answered by the owner: %s", describeJob(got))
	}

	pids := e.agentPIDs(allow.ID)
	if len(pids) != 1 {
		t.Fatalf("want the conversation's one agent kept in its container after the turn, got %v", pids)
	}
	j2 := e.send(allow.ID, "to be cancelled")
	e.waitJob(j2.ID, "to stream", func(j wire.Job) bool { return slices.Contains(runnerTypes(j), "agent_message_chunk") })
	if _, err := e.user.Cancel(e.ctx, j2.ID); err != nil {
		t.Fatal(err)
	}
	got := e.waitEnded(j2.ID)
	if got.State != wire.JobCancelled || !strings.Contains(got.Reason, "interrupted at your request") {
		t.Fatalf("cancelled turn: %s", describeJob(got))
	}
	if cv := e.conv(allow.ID); cv.State != wire.ConversationUsable || cv.NativeTurn != 2 {
		t.Fatalf("after the cancel: %s at native turn %d, want usable at 2", cv.State, cv.NativeTurn)
	}
	j3 := e.waitEnded(e.send(allow.ID, "after the cancel").ID)
	if j3.State != wire.JobSucceeded || !strings.Contains(runnerTexts(j3), "successfully updated the configuration") {
		t.Fatalf("turn after the cancel: %s", describeJob(j3))
	}
	if now := e.agentPIDs(allow.ID); !slices.Equal(now, pids) {
		t.Fatalf("agents %v after the cancel, want the same process %v and its session", now, pids)
	}
	if cv := e.conv(allow.ID); cv.NativeTurn != 3 {
		t.Fatalf("native turn %d, want 3", cv.NativeTurn)
	}
}

// A4 on the Docker backend: under ask, a request nobody answers within
// --permission-timeout is answered cancelled (by the timeout), the agent
// gets that and ends its turn, and the job succeeds.
func TestACPExampleAgentAskTimeoutDocker(t *testing.T) {
	t.Parallel()
	e := acpDockerEnv(t, "runnerd-test/acp-example-timeout:dev", "--permission-timeout", "1s")
	c := e.acpConversation(wire.PermissionAsk)
	j := e.waitEnded(e.send(c.ID, "nobody answers").ID)
	if j.State != wire.JobSucceeded {
		t.Fatalf("turn: %s", describeJob(j))
	}
	ev, ok := findEvent(j, "", wire.EventPermissionRequested)
	if !ok {
		t.Fatalf("no permission_requested: %s", describeJob(j))
	}
	var req struct {
		RequestID string `json:"request_id"`
	}
	if err := json.Unmarshal(ev.Data, &req); err != nil || req.RequestID == "" {
		t.Fatalf("permission_requested %s: %v", ev.Data, err)
	}
	if !hasAnswer(j, req.RequestID, `"outcome":"cancelled"`, `"by":"timeout"`) {
		t.Fatalf("want the request answered cancelled by the timeout: %s", describeJob(j))
	}
	if text := runnerTexts(j); strings.Contains(text, "successfully updated") || strings.Contains(text, "skip the configuration") {
		t.Fatalf("the agent acted on an answer nobody gave: %q", text)
	}
	if len(j.PendingPermissions) != 0 {
		t.Fatalf("still pending after the turn: %+v", j.PendingPermissions)
	}
}
