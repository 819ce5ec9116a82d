package integration

import (
	"archive/tar"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/client"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/sandbox/docker"
	"github.com/runnerd/runnerd/wire"
)

// dockerEngine is the real Docker engine, or a skip (a failure under
// RUNNERD_REQUIRE_DOCKER=1) when none answers.
func dockerEngine(t *testing.T) *client.Client {
	t.Helper()
	eng, err := docker.EngineFromEnv()
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = eng.Ping(ctx)
		cancel()
	}
	if err != nil {
		if os.Getenv("RUNNERD_REQUIRE_DOCKER") == "1" {
			t.Fatalf("RUNNERD_REQUIRE_DOCKER=1 but no Docker engine answers: %v", err)
		}
		t.Skipf("no Docker engine answers (%v); set RUNNERD_REQUIRE_DOCKER=1 to make this a failure", err)
	}
	t.Cleanup(func() { eng.Close() })
	return eng
}

// nativeTurnOf is the native turn ordinal the demo agent reported in the
// job's first runner event of type typ, or 0.
func nativeTurnOf(j wire.Job, typ string) int64 {
	for _, ev := range j.Events {
		if ev.Source == "runner" && ev.Type == typ {
			var d struct {
				NativeTurn int64 `json:"native_turn"`
			}
			if json.Unmarshal(ev.Data, &d) == nil {
				return d.NativeTurn
			}
		}
	}
	return 0
}

// containerTranscript reads the demo agent's transcript out of the
// conversation's container: the prompts it received, in order.
func containerTranscript(t *testing.T, eng *client.Client, containerID string) []string {
	t.Helper()
	prompts, gone := containerTranscriptUnlessGone(t, eng, containerID)
	if gone {
		t.Fatalf("read the transcript from container %s: no such container", containerID)
	}
	return prompts
}

// containerTranscriptUnlessGone is containerTranscript for a container the
// daemon may be removing: gone says it no longer exists.
func containerTranscriptUnlessGone(t *testing.T, eng *client.Client, containerID string) (prompts []string, gone bool) {
	t.Helper()
	rc, _, err := eng.CopyFromContainer(context.Background(), containerID, docker.DefaultWorkspace+"/.demoagent/transcript.jsonl")
	if cerrdefs.IsNotFound(err) {
		if _, ierr := eng.ContainerInspect(context.Background(), containerID); cerrdefs.IsNotFound(ierr) {
			return nil, true
		}
	}
	if err != nil {
		t.Fatalf("read the transcript from container %s: %v", containerID, err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	if _, err := tr.Next(); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(io.LimitReader(tr, 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var e struct {
			Prompt string `json:"prompt"`
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("transcript line %q: %v", line, err)
		}
		prompts = append(prompts, e.Prompt)
	}
	return prompts, false
}

// TestCancelKeepsConversationDocker is K10 on the Docker backend against
// the real engine: the user's cancel of a running, admitted turn interrupts
// the agent in its retained container; the job ends cancelled on its one
// attempt with an interrupted settlement, and the owner reads that the
// reply was interrupted at their request; the conversation stays usable,
// and its next message runs in the same container on the same native
// session: the agent reports native turn 2, on one attempt, and its
// transcript in the container holds each prompt once.
func TestCancelKeepsConversationDocker(t *testing.T) {
	t.Parallel()
	eng := dockerEngine(t)
	e := newEnv(t, envOpts{})
	ctx := e.ctx
	const tag = "runnerd-test/cancel-agent:dev"
	if err := docker.BuildScratchImage(ctx, eng, docker.ScratchImage{
		Tag:   tag,
		Files: []docker.ImageFile{{Path: "/demoagent", Source: bins.DemoAgent, Exec: true}},
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
		c.Args = append(c.Args, "--sandbox-sweep", "0")
	})
	c, err := e.user.Create(ctx, wire.CreateConversationRequest{Title: "cancel in docker", Image: tag, AgentCommand: []string{"/demoagent"}})
	if err != nil {
		t.Fatal(err)
	}
	j := e.send(c.ID, "never ends\n!hang")
	running := e.waitJob(j.ID, "the agent to run in its container", func(j wire.Job) bool { return nativeTurnOf(j, "status") == 1 })
	cancelAt := time.Now()
	if _, err := e.user.Cancel(ctx, j.ID); err != nil {
		t.Fatal(err)
	}
	got := e.waitEnded(j.ID)
	t.Logf("job ended %v after the cancel", got.EndedAt.Sub(cancelAt))
	if got.State != wire.JobCancelled || got.Outcome != wire.OutcomeCancelled || len(got.Attempts) != 1 ||
		got.Attempts[0].State != wire.AttemptFinished {
		t.Fatalf("want cancelled on its one attempt, reported by the runner; got %s", describeJob(got))
	}
	if !strings.Contains(got.Reason, "interrupted at your request") {
		t.Errorf("the owner reads %q, want that the reply was interrupted at their request", got.Reason)
	}
	if ev, ok := findEvent(got, got.Attempts[0].ID, "settled"); !ok || !strings.Contains(string(ev.Data), `"interrupted":true`) {
		t.Errorf("no interrupted settlement: %s", describeJob(got))
	}
	cv := e.conv(c.ID)
	if cv.State != wire.ConversationUsable || cv.NativeTurn != 1 || cv.ContainerID != running.Attempts[0].ContainerID {
		t.Fatalf("after the cancel: conversation %+v, want usable at native turn 1 in container %s", cv, running.Attempts[0].ContainerID)
	}

	next := e.waitEnded(e.send(c.ID, "after the cancel").ID)
	if next.State != wire.JobSucceeded || len(next.Attempts) != 1 {
		t.Fatalf("the message after the cancel: %s", describeJob(next))
	}
	if n := nativeTurnOf(next, "turn.started"); n != 2 {
		t.Errorf("the next turn ran at native turn %d, want 2 (the same session, the interrupted turn counted once)", n)
	}
	if a := next.Attempts[0]; a.ContainerID != cv.ContainerID {
		t.Errorf("the next turn ran in container %s, want the retained %s", a.ContainerID, cv.ContainerID)
	}
	if cv := e.conv(c.ID); cv.State != wire.ConversationUsable || cv.NativeTurn != 2 {
		t.Errorf("after the next message: conversation %s at native turn %d, want usable at 2", cv.State, cv.NativeTurn)
	}
	if got := containerTranscript(t, eng, cv.ContainerID); !slices.Equal(got, []string{"never ends\n!hang", "after the cancel"}) {
		t.Errorf("the agent in the container received %q, want each prompt once", got)
	}
}

// TestCancelReachesRunningTurnWithinSeconds measures how long the user's
// cancel takes to reach a running turn when renewals are 30 s apart (the
// default interval): the host's cancel poll carries it (K10), so the agent
// is interrupted and the job ends cancelled long before the next renewal
// could have said so, with the conversation usable. Asserted: under 10 s
// (a third of the renewal interval, robust on a loaded machine); the
// figure is logged.
func TestCancelReachesRunningTurnWithinSeconds(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	const renewal = 30 * time.Second
	d := e.startDaemon(func(c *fleet.DaemonConfig) {
		c.LeaseTTL = 4 * renewal
		c.RenewInterval = renewal
		c.RenewTimeout = 5 * time.Second
		c.StopGrace = 10 * time.Second
	})
	c := e.conversation("cancel latency")
	const hang = "never ends\n!hang"
	j := e.send(c.ID, hang)
	e.waitPrompts(c.ID, 1)
	agents := e.agents(c.ID)
	if len(agents) != 1 {
		t.Fatalf("want one agent running, got %v", agents)
	}
	cancelAt := time.Now()
	if _, err := e.user.Cancel(e.ctx, j.ID); err != nil {
		t.Fatal(err)
	}
	gone, err := waitGone(agents[0].Pid, waitFor)
	if err != nil {
		t.Fatalf("the agent still runs after the cancel: %v", err)
	}
	got := e.waitEnded(j.ID)
	stopped, ended := gone.Seen.Sub(cancelAt), got.EndedAt.Sub(cancelAt)
	t.Logf("cancel delivery with renewals every %v: agent stopped %v after the cancel, job ended %v after it", renewal, stopped, ended)
	if ended > 10*time.Second {
		t.Errorf("the job ended %v after the cancel, want well within the %v renewal interval", ended, renewal)
	}
	if got.State != wire.JobCancelled || len(got.Attempts) != 1 || !strings.Contains(got.Reason, "interrupted at your request") {
		t.Fatalf("want cancelled on its one attempt, interrupted at the user's request; got %s", describeJob(got))
	}
	if got.Cause != wire.CauseCancelled || !strings.Contains(got.CauseEvidence, "cancel") {
		t.Errorf("cancelled job's cause %q (%q), want %s (S5)", got.Cause, got.CauseEvidence, wire.CauseCancelled)
	}
	if !strings.Contains(d.Output(), `"msg":"runnerd_cancel_received","job_id":"`+j.ID+`","attempt_id":"`+got.Attempts[0].ID+`","via":"host_poll"`) {
		t.Errorf("the cancel did not come by the host's poll:\n%s", d.Output())
	}
	if cv := e.conv(c.ID); cv.State != wire.ConversationUsable || cv.NativeTurn != 1 {
		t.Errorf("after the cancel the conversation is %s at native turn %d, want usable at 1", cv.State, cv.NativeTurn)
	}
	e.assertPromptsOnce(c.ID, hang)
}

// TestCancelWhoseInterruptCannotSettleFailsClosed: when the interrupted
// boundary cannot be settled with the control plane (every settlement try
// answered 503, R24), the cancelled turn fails closed as any admitted turn
// without a settlement: the job ends cancelled on its one attempt, the
// conversation is quarantined (K13, R30), and the prompt was delivered
// once and never again (K10).
func TestCancelWhoseInterruptCannotSettleFailsClosed(t *testing.T) {
	t.Parallel()
	// Nothing here waits for a lease to run out: a calm lease keeps a
	// loaded machine's slow renewals from ending the turn another way.
	e := newEnv(t, envOpts{faults: true, leaseTTL: calmLease})
	e.startDaemon(func(c *fleet.DaemonConfig) {
		calm(c)
		c.StopGrace = 10 * time.Second
	})
	c := e.conversation("cancel unsettled")
	const hang = "never ends\n!hang"
	j := e.send(c.ID, hang)
	e.waitPrompts(c.ID, 1)
	agents := e.agents(c.ID)
	if len(agents) != 1 {
		t.Fatalf("want one agent running, got %v", agents)
	}
	e.faults.refuse(wire.OpSettlement, http.StatusServiceUnavailable)
	if _, err := e.user.Cancel(e.ctx, j.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := waitGone(agents[0].Pid, waitFor); err != nil {
		t.Fatalf("the agent still runs after the cancel: %v", err)
	}
	got := e.waitEnded(j.ID)
	if got.State != wire.JobCancelled || len(got.Attempts) != 1 || got.Attempts[0].State != wire.AttemptFinished {
		t.Fatalf("want cancelled on its one attempt, reported by the runner; got %s", describeJob(got))
	}
	if _, ok := findEvent(got, "", "settled"); ok {
		t.Fatalf("a settlement was recorded through a proxy that refused every one: %s", describeJob(got))
	}
	if n := len(e.faults.calls(j.ID, wire.OpSettlement)); n != 3 {
		t.Errorf("%d settlement tries, want 3 (R24)", n)
	}
	// K13: admitted and unsettled, so quarantined rather than LOST; its
	// next turn verifies the sandbox.
	cv := e.conv(c.ID)
	if cv.State != wire.ConversationQuarantined || cv.InterruptedJobID != j.ID {
		t.Fatalf("conversation %s (interrupted %q): want quarantined naming %s", cv.State, cv.InterruptedJobID, j.ID)
	}
	e.assertPromptsOnce(c.ID, hang)
}
