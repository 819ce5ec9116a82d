package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// idleFor is the tests' --sandbox-idle: short, since nothing here waits
// for it by the clock — the tests wait for the eviction's record and for
// the supervisor's pid to go.
const idleFor = time.Second

// supervisorOf is the live supervisor of the conversation's process
// sandbox (the one serving its socket), if one runs.
func (e *env) supervisorOf(convID string) (proc, bool) {
	socket := filepath.Join(fleet.SandboxDir(e.stateDir, convID), "supervisor.sock")
	for _, p := range e.procs() {
		for i := 0; i+1 < len(p.Argv); i++ {
			if p.Argv[i] == "--socket" && p.Argv[i+1] == socket {
				return p, true
			}
		}
	}
	return proc{}, false
}

// daemonRecords are the daemon's records named msg for the conversation,
// as decoded JSON objects, read from the test's output log.
func (e *env) daemonRecords(msg, convID string) []map[string]any {
	e.t.Helper()
	raw, err := os.ReadFile(filepath.Join(e.dir, "output.log"))
	if err != nil {
		e.t.Fatal(err)
	}
	var out []map[string]any
	for _, line := range strings.Split(string(raw), "\n") {
		_, rec, ok := strings.Cut(line, "runnerd| ")
		if !ok || !strings.Contains(rec, `"msg":"`+msg+`"`) {
			continue
		}
		var r map[string]any
		if json.Unmarshal([]byte(rec), &r) == nil && r["conversation_id"] == convID {
			out = append(out, r)
		}
	}
	return out
}

// waitRecord waits until the daemon wrote a record named msg for the
// conversation, and returns it.
func (e *env) waitRecord(msg, convID string) map[string]any {
	e.t.Helper()
	ctx, cancel := e.waitCtx()
	defer cancel()
	var got []map[string]any
	err := fleet.Poll(ctx, tick, fmt.Sprintf("the daemon's %s record for %s", msg, convID), func(context.Context) (bool, error) {
		got = e.daemonRecords(msg, convID)
		return len(got) > 0, nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return got[0]
}

// evicted runs one turn of conv, waits for its idle eviction — the
// daemon's sandbox_evicted record, and the supervisor's (and any agent's)
// pid gone — and checks the conversation stays usable with nothing of its
// sandbox running, nothing of it deleted.
func (e *env) evicted(conv wire.Conversation, prompt string, agentPids func() []int) {
	e.t.Helper()
	if j := e.waitEnded(e.send(conv.ID, prompt).ID); j.State != wire.JobSucceeded {
		e.t.Fatalf("the first turn: %s", describeJob(j))
	}
	sup, ok := e.supervisorOf(conv.ID)
	if !ok {
		e.t.Fatal("no supervisor runs for the conversation after its turn")
	}
	pids := append([]int{sup.Pid}, agentPids()...)
	e.t.Logf("resident memory of the idle conversation's processes before its eviction: %d KiB (pids %v; after: none run)", rssKiB(pids), pids)
	rec := e.waitRecord(diagnostics.MsgSandboxEvicted, conv.ID)
	if rec["backend"] != "process" || rec[diagnostics.KeyIdle].(float64) < float64(idleFor.Milliseconds()) {
		e.t.Errorf("eviction record %v: want backend process, idle_ms ≥ %d", rec, idleFor.Milliseconds())
	}
	for _, pid := range pids {
		if _, err := waitGone(pid, waitFor); err != nil {
			e.t.Fatalf("pid %d of the evicted sandbox: %v", pid, err)
		}
	}
	if p, ok := e.supervisorOf(conv.ID); ok {
		e.t.Fatalf("a supervisor of the evicted sandbox runs: %+v", p)
	}
	if cv := e.conv(conv.ID); cv.State != wire.ConversationUsable {
		e.t.Fatalf("the evicted conversation is %s, want usable", cv.State)
	}
	if _, err := os.Stat(fleet.Workspace(e.stateDir, conv.ID)); err != nil {
		e.t.Fatalf("the evicted conversation's workspace: %v", err)
	}
}

// woken sends the next message of an evicted conversation and checks that
// it ran on a supervisor started again, with the wake recorded.
func (e *env) woken(conv wire.Conversation, prompt string) wire.Job {
	e.t.Helper()
	start := time.Now()
	j := e.waitEnded(e.send(conv.ID, prompt).ID)
	if j.State != wire.JobSucceeded {
		e.t.Fatalf("the turn after the eviction: %s", describeJob(j))
	}
	e.t.Logf("the woken turn took %v from send to its end (one sample on a shared machine, not a bound)", time.Since(start).Round(time.Millisecond))
	if w := e.waitRecord(diagnostics.MsgSandboxWoken, conv.ID); w["backend"] != "process" {
		e.t.Errorf("wake record %v", w)
	}
	if _, ok := e.supervisorOf(conv.ID); !ok {
		e.t.Fatal("no supervisor runs after the woken turn")
	}
	return j
}

// S1 end to end on the process backend with the demo agent (lines): a
// conversation's turn, then --sandbox-idle without one: its supervisor is
// stopped (pid gone, sandbox_evicted), its sandbox kept and the
// conversation usable; the next message wakes it on the same host and
// resumes the native session — the agent's transcript shows both prompts
// once each, at native turns 1 and 2 — then it is evicted again.
func TestS1IdleEvictionAndWakeProcess(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.startDaemon(func(c *fleet.DaemonConfig) { c.Args = append(c.Args, "--sandbox-idle="+idleFor.String()) })
	conv := e.conversation("idle")
	e.evicted(conv, "hello", func() []int { return pidsOf(e.agents(conv.ID)) })

	e.woken(conv, "after the wake")
	e.assertPromptsOnce(conv.ID, "hello", "after the wake")
	if cv := e.conv(conv.ID); cv.State != wire.ConversationUsable || cv.NativeTurn != 2 {
		t.Fatalf("after the wake: %s at native turn %d, want usable at 2", cv.State, cv.NativeTurn)
	}
	// Idle again: evicted again.
	sup, _ := e.supervisorOf(conv.ID)
	if _, err := waitGone(sup.Pid, waitFor); err != nil {
		t.Fatalf("the woken supervisor (pid %d) after another idle period: %v", sup.Pid, err)
	}
	if n := len(e.daemonRecords(diagnostics.MsgSandboxEvicted, conv.ID)); n < 2 {
		// The record follows the pid's end: wait for it.
		ctx, cancel := e.waitCtx()
		defer cancel()
		if err := fleet.Poll(ctx, tick, "the second eviction record", func(context.Context) (bool, error) {
			return len(e.daemonRecords(diagnostics.MsgSandboxEvicted, conv.ID)) >= 2, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// S1 over ACP with demoagent --acp: the evicted supervisor's ACP agent
// process ends with it (no turn was pending, so no session/cancel), and
// the next message loads the kept session into a new agent process
// (session/load, A6) — the same session: both prompts once each, the
// native turn going on from 1 to 2 — never a silent new session.
func TestS1IdleEvictionAndWakeACP(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.startDaemon(func(c *fleet.DaemonConfig) { c.Args = append(c.Args, "--sandbox-idle="+idleFor.String()) })
	conv, err := e.user.Create(e.ctx, wire.CreateConversationRequest{Title: "idle acp", Image: "demo",
		AgentCommand: []string{bins.DemoAgent, "--acp"}, AgentProtocol: wire.AgentProtocolACP})
	if err != nil {
		t.Fatal(err)
	}
	var agent []int
	e.evicted(conv, "hello", func() []int {
		agent = pidsOf(e.agents(conv.ID))
		if len(agent) != 1 {
			t.Fatalf("want the conversation's one ACP agent kept after its turn, got %v", agent)
		}
		return agent
	})
	if left := e.agents(conv.ID); len(left) != 0 {
		t.Fatalf("agents of the evicted conversation still run: %+v", left)
	}

	e.woken(conv, "after the wake")
	e.assertPromptsOnce(conv.ID, "hello", "after the wake")
	if cv := e.conv(conv.ID); cv.State != wire.ConversationUsable || cv.NativeTurn != 2 {
		t.Fatalf("after the wake: %s at native turn %d, want usable at 2", cv.State, cv.NativeTurn)
	}
	if now := pidsOf(e.agents(conv.ID)); len(now) != 1 || now[0] == agent[0] {
		t.Fatalf("agents after the wake %v, want one new process (the old was %d)", now, agent[0])
	}
}

func pidsOf(ps []proc) []int {
	out := make([]int, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.Pid)
	}
	return out
}

// S1 with an ACP agent that cannot load a session (demoagent --acp
// --no-load-session): its session lives only in its running process, so
// idle eviction keeps the sandbox running rather than make the
// conversation unrecoverable — one sandbox_evict_failed record with class
// session_not_loadable, the same supervisor and agent alive, and the next
// message runs on them, the same session.
func TestS1IdleKeepsUnloadableACPSession(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.startDaemon(func(c *fleet.DaemonConfig) { c.Args = append(c.Args, "--sandbox-idle="+idleFor.String()) })
	conv, err := e.user.Create(e.ctx, wire.CreateConversationRequest{Title: "idle acp unloadable", Image: "demo",
		AgentCommand: []string{bins.DemoAgent, "--acp", "--no-load-session"}, AgentProtocol: wire.AgentProtocolACP})
	if err != nil {
		t.Fatal(err)
	}
	if j := e.waitEnded(e.send(conv.ID, "hello").ID); j.State != wire.JobSucceeded {
		t.Fatalf("the first turn: %s", describeJob(j))
	}
	sup, ok := e.supervisorOf(conv.ID)
	agent := pidsOf(e.agents(conv.ID))
	if !ok || len(agent) != 1 {
		t.Fatalf("supervisor %v (%v), agents %v after the first turn", sup, ok, agent)
	}
	rec := e.waitRecord(diagnostics.MsgSandboxEvictFailed, conv.ID)
	if rec[diagnostics.KeyClass] != "session_not_loadable" {
		t.Fatalf("eviction record %v, want class session_not_loadable", rec)
	}
	if !alive(sup.Pid) || !alive(agent[0]) {
		t.Fatalf("the unloadable sandbox was stopped: supervisor %d alive %v, agent %d alive %v", sup.Pid, alive(sup.Pid), agent[0], alive(agent[0]))
	}
	if n := len(e.daemonRecords(diagnostics.MsgSandboxEvicted, conv.ID)); n != 0 {
		t.Fatalf("%d eviction records for a sandbox kept running", n)
	}
	if j := e.waitEnded(e.send(conv.ID, "still here").ID); j.State != wire.JobSucceeded {
		t.Fatalf("the next turn: %s", describeJob(j))
	}
	e.assertPromptsOnce(conv.ID, "hello", "still here")
	if now := pidsOf(e.agents(conv.ID)); len(now) != 1 || now[0] != agent[0] {
		t.Fatalf("agents %v after the next turn, want the same process %d", now, agent[0])
	}
}

// rssKiB is the sum of the processes' resident set sizes (VmRSS), for the
// log: a figure, not a bound.
func rssKiB(pids []int) int {
	total := 0
	for _, pid := range pids {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(raw), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				var kb int
				fmt.Sscanf(strings.TrimSpace(v), "%d", &kb)
				total += kb
			}
		}
	}
	return total
}

// S1 end to end on the Docker backend against the real engine: after a
// turn and --sandbox-idle without one, the conversation's container is
// stopped and kept (sandbox_evicted; the engine reports it exited, the same
// container); the next message starts that same container again — the
// conversation's recorded container unchanged, its workspace the same (the
// agent's transcript in it holds both prompts, once each) and the native
// session going on at turn 2.
func TestS1IdleEvictionAndWakeDocker(t *testing.T) {
	t.Parallel()
	e := newDockerEnv(t, envOpts{}, "")
	e.startDaemon(func(c *fleet.DaemonConfig) {
		c.Sandbox = "docker"
		c.Args = append(c.Args, "--sandbox-sweep", "0", "--sandbox-idle="+idleFor.String())
	})
	conv := e.conversation("idle in docker")
	if j := e.waitEnded(e.send(conv.ID, "hello").ID); j.State != wire.JobSucceeded {
		t.Fatalf("the first turn: %s", describeJob(j))
	}
	retained := e.conv(conv.ID).ContainerID
	rec := e.waitRecord(diagnostics.MsgSandboxEvicted, conv.ID)
	if rec["backend"] != "docker" {
		t.Errorf("eviction record %v, want backend docker", rec)
	}
	info, err := e.eng.ContainerInspect(e.ctx, retained)
	if err != nil || info.State.Running {
		t.Fatalf("the evicted container %.12s: %+v, %v; want it kept, stopped", retained, info.State, err)
	}
	if cv := e.conv(conv.ID); cv.State != wire.ConversationUsable {
		t.Fatalf("the evicted conversation is %s, want usable", cv.State)
	}

	start := time.Now()
	if j := e.waitEnded(e.send(conv.ID, "after the wake").ID); j.State != wire.JobSucceeded {
		t.Fatalf("the turn after the eviction: %s", describeJob(j))
	}
	t.Logf("the woken turn took %v from send to its end (one sample on a shared machine, not a bound)", time.Since(start).Round(time.Millisecond))
	e.waitRecord(diagnostics.MsgSandboxWoken, conv.ID)
	if cv := e.conv(conv.ID); cv.ContainerID != retained || cv.NativeTurn != 2 || cv.State != wire.ConversationUsable {
		t.Fatalf("after the wake: container %.12s at native turn %d (%s), want the retained %.12s at 2, usable", cv.ContainerID, cv.NativeTurn, cv.State, retained)
	}
	if ids := e.containers(conv.ID); !slices.Equal(ids, []string{retained}) {
		t.Fatalf("containers %v after the wake, want the retained %.12s only", ids, retained)
	}
	if got := containerTranscript(t, e.eng, retained); !slices.Equal(got, []string{"hello", "after the wake"}) {
		t.Fatalf("the agent in the container received %q, want each prompt once", got)
	}
}
