package integration

import (
	"context"
	"fmt"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// reattachLease is the daemon's lease in these tests: long enough that a
// restarted daemon finds the lease of the killed one still valid, however
// slow the machine, and re-attaches before the child's own deadline (K5).
const reattachLease = 5 * time.Second

var reattachedRecord = regexp.MustCompile(`"msg":"runnerd_turn_reattached".*"job_id":"([^"]+)".*"orphaned_ms":(\d+)`)

// kill9 kills d with SIGKILL and waits for it; its turn children are not
// killed with it (P5).
func (e *env) kill9(d *fleet.Daemon) {
	e.t.Helper()
	d.Signal(syscall.SIGKILL)
	if err := d.Wait(waitFor); err != nil {
		e.t.Fatal(err)
	}
}

// waitCall waits until the fault proxy has seen a call of op for job.
func (e *env) waitCall(job, op string) {
	e.t.Helper()
	ctx, cancel := e.waitCtx()
	defer cancel()
	if err := fleet.Poll(ctx, tick, "a "+op+" call of job "+job, func(context.Context) (bool, error) {
		return len(e.faults.calls(job, op)) > 0, nil
	}); err != nil {
		e.t.Fatal(err)
	}
}

// assertReattached checks that d's output has runnerd_turn_reattached for
// job, and returns how long the child was orphaned.
func assertReattached(t *testing.T, d *fleet.Daemon, mark int, job string) time.Duration {
	t.Helper()
	re := regexp.MustCompile(`"msg":"runnerd_turn_reattached".*"job_id":"` + regexp.QuoteMeta(job) + `".*"orphaned_ms":(\d+)`)
	m, err := d.AwaitOutput(mark, re, waitFor)
	if err != nil {
		t.Errorf("no runnerd_turn_reattached for job %s: %v", job, err)
		return 0
	}
	var ms int64
	fmt.Sscan(m[1], &ms)
	return time.Duration(ms) * time.Millisecond
}

// assertCompletedOnce: the job succeeded with one attempt and no worker
// loss, and the conversation is usable at native turn n.
func (e *env) assertCompletedOnce(jobID, convID string, n int64) {
	e.t.Helper()
	j := e.waitEnded(jobID)
	if j.State != wire.JobSucceeded || j.AttemptCount != 1 || j.WorkerLostCount != 0 || len(j.Attempts) != 1 {
		e.t.Errorf("want succeeded after one attempt, as if nothing had happened; got %s", describeJob(j))
	}
	if c := e.conv(convID); c.State != wire.ConversationUsable || c.NativeTurn != n {
		e.t.Errorf("conversation %s at native turn %d, want usable at %d", c.State, c.NativeTurn, n)
	}
}

// TestKill9InEveryPhaseThenRestart (P5): the daemon is killed with SIGKILL
// in each phase of an admitted-to-be turn, then started again on the same
// state directory. The turn child outlives it, fenced by its own lease
// deadline, and waits on its re-attach socket:
//
//   - after ACCEPT, before admission (the sandbox's lock held by the test),
//   - during the stream loop (the agent running with the prompt),
//   - during settlement (the settlement call in flight at the kill),
//
// and in each the new daemon re-attaches (runnerd_turn_reattached), renews
// the lease and the turn completes: one attempt, no worker loss, the prompt
// reached the agent once, the conversation usable. After settlement, before
// the finish (the report in flight at the kill), the child is gone with its
// RESULT kept in the daemon's state: the new daemon re-sends the persisted
// report and the turn completes the same way. (Before ACCEPT: the child
// ends itself and nothing is re-attached, handover.TestReattachBeforeAccept;
// the never-admitted job runs again without counting an attempt, P6, as
// runner.TestP6RestartDecisions proves.)
func TestKill9InEveryPhaseThenRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{faults: true})
	d := e.startDaemon(func(c *fleet.DaemonConfig) { c.LeaseTTL = reattachLease })

	t.Run("after ACCEPT before admission", func(t *testing.T) {
		c := e.conversation("preparing")
		unlock := holdSandboxLock(t, e.stateDir, c.ID)
		const prompt = "a turn whose sandbox is slow to come\n!events 2"
		j := e.send(c.ID, prompt)
		e.waitLockWaiter(c.ID)
		e.kill9(d)
		if len(e.turnChildren()) != 1 {
			t.Fatalf("the turn child did not outlive the daemon: %v", e.turnChildren())
		}
		d = e.restart(d)
		assertReattached(t, d, 0, j.ID)
		unlock()
		e.assertCompletedOnce(j.ID, c.ID, 1)
		e.assertPromptsOnce(c.ID, prompt)
	})

	t.Run("during the stream loop", func(t *testing.T) {
		c := e.conversation("streaming")
		const prompt = "a turn cut in its stream\n!events 2\n!sleep 6s\n!events 1"
		j := e.send(c.ID, prompt)
		e.waitPrompts(c.ID, 1)
		agents := e.agents(c.ID)
		if len(agents) != 1 {
			t.Fatalf("agents %v", agents)
		}
		e.kill9(d)
		d = e.restart(d)
		orphaned := assertReattached(t, d, 0, j.ID)
		if !alive(agents[0].Pid) {
			t.Errorf("the agent was not running any more when the turn was re-attached")
		}
		if orphaned <= 0 || orphaned > reattachLease {
			t.Errorf("orphaned for %v, want more than zero and less than the lease", orphaned)
		}
		e.assertCompletedOnce(j.ID, c.ID, 1)
		e.assertPromptsOnce(c.ID, prompt)
	})

	t.Run("during settlement", func(t *testing.T) {
		c := e.conversation("settling")
		const prompt = "a turn whose settlement is in flight"
		e.faults.hang(wire.OpSettlement)
		j := e.send(c.ID, prompt)
		e.waitCall(j.ID, wire.OpSettlement)
		e.kill9(d)
		e.faults.hang("") // the child's next try gets through, with no daemon
		d = e.restart(d)
		assertReattached(t, d, 0, j.ID)
		e.assertCompletedOnce(j.ID, c.ID, 1)
		e.assertPromptsOnce(c.ID, prompt)
	})

	t.Run("after settlement before finish", func(t *testing.T) {
		c := e.conversation("finishing")
		const prompt = "a turn whose report is in flight"
		e.faults.hang(wire.OpFinish)
		j := e.send(c.ID, prompt)
		e.waitCall(j.ID, wire.OpFinish)
		e.kill9(d)
		e.faults.hang("")
		e.waitNoTurnChild() // it had its KEPT: nothing to re-attach
		d = e.restart(d)
		if _, err := d.AwaitOutput(0, regexp.MustCompile(`"msg":"runnerd_attempt_recovered".*"job_id":"`+j.ID+`".*"decision":"resent"`), waitFor); err != nil {
			t.Errorf("the persisted report was not re-sent: %v", err)
		}
		e.assertCompletedOnce(j.ID, c.ID, 1)
		e.assertPromptsOnce(c.ID, prompt)
	})
	e.waitNoTurnChild()
}

// TestRestartAfterLeaseEndedReattachesNothing (P5, K5): the daemon is
// killed during a silent admitted turn and comes back only after the lease
// has ended. The child stopped its agent by itself at its lease deadline
// and ended; the new daemon re-attaches nothing, the prompt reached the
// agent once and the turn is not run again.
func TestRestartAfterLeaseEndedReattachesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	d := e.startDaemon(nil)
	j, agent, child := e.silentTurn("down past the lease")
	e.kill9(d)
	if _, err := waitGone(agent.Pid, waitFor); err != nil {
		t.Fatalf("the agent outlived the lease of its dead daemon: %v", err)
	}
	if _, err := waitGone(child.Pid, waitFor); err != nil {
		t.Fatalf("the turn child outlived its lease: %v", err)
	}
	// The child and the supervisor each stop the agent at the same deadline
	// (K5): whichever fires first, the child records it.
	// Its record may still be on its way through the output pipe when
	// the child is gone: wait for it rather than read once.
	if _, err := d.AwaitOutput(0, regexp.MustCompile(`"msg":"agent_turn_lease_deadline"|"msg":"agent_turn_interrupted".*"error_class":"deadline_passed"`), waitFor); err != nil {
		t.Errorf("the child did not say its lease deadline stopped the turn (agent_turn_lease_deadline, or agent_turn_interrupted with deadline_passed from the supervisor): %v", err)
	}
	d = e.restart(d)
	ended := e.waitEnded(j.ID)
	if len(ended.Attempts) != 1 {
		t.Errorf("the turn ran again: %s", describeJob(ended))
	}
	if _, err := d.AwaitOutput(0, regexp.MustCompile(`"msg":"runnerd_attempt_recovered".*"job_id":"`+j.ID+`"`), waitFor); err != nil {
		t.Errorf("the restart did not resolve the attempt: %v", err)
	}
	if reattachedRecord.MatchString(d.Output()) {
		t.Errorf("a turn was re-attached after its lease ended")
	}
	e.assertLostPromptOnce(j.ConversationID, "a long, quiet turn\n!silent 10m", ended)
}

// TestTwentyRoundsOfKill9 (P5): twenty rounds of three admitted turns, the
// daemon killed with SIGKILL while they run and started again each time:
// every turn completes, no conversation is LOST, every prompt reached its
// agent exactly once, each job had one attempt.
func TestTwentyRoundsOfKill9(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	d := e.startDaemon(func(c *fleet.DaemonConfig) { c.LeaseTTL = reattachLease })
	const rounds = 20
	var convs [3]wire.Conversation
	prompts := make([][]string, len(convs))
	for i := range convs {
		convs[i] = e.conversation(fmt.Sprintf("round robin %d", i))
	}
	for r := 1; r <= rounds; r++ {
		var jobs [3]wire.Job
		for i, c := range convs {
			p := fmt.Sprintf("round %d of conversation %d\n!events 1\n!sleep 800ms", r, i)
			prompts[i] = append(prompts[i], p)
			jobs[i] = e.send(c.ID, p)
		}
		for _, c := range convs {
			e.waitPrompts(c.ID, r)
		}
		e.kill9(d)
		d = e.restart(d)
		for i, j := range jobs {
			if ended := e.waitEnded(j.ID); ended.State != wire.JobSucceeded || len(ended.Attempts) != 1 {
				t.Fatalf("round %d, conversation %d: %s", r, i, describeJob(ended))
			}
		}
	}
	for i, c := range convs {
		if got := e.conv(c.ID); got.State != wire.ConversationUsable || got.NativeTurn != rounds {
			t.Errorf("conversation %d: %s at native turn %d, want usable at %d", i, got.State, got.NativeTurn, rounds)
		}
		e.assertPromptsOnce(c.ID, prompts[i]...)
	}
}
