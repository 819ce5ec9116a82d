package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// TestHappyPathSeveralConversations runs three conversations of three
// turns each through one daemon at once, every message sent up front: the
// control plane hands out one turn of a conversation at a time, in order;
// each turn succeeds on its first attempt; the retained supervisor serves
// every turn of its conversation, so the agent's native turn ordinal
// continues 1, 2, 3 and the control plane's settled boundary follows it;
// every prompt reaches the agent exactly once. One turn stays silent for
// more than two renewal intervals and keeps its lease (R9). Then SIGTERM
// stops the idle daemon cleanly, and no turn child is left.
func TestHappyPathSeveralConversations(t *testing.T) {
	t.Parallel()
	// The happy path waits for no lease to run out: on a calm lease a
	// loaded machine's slow renewals cannot turn it into a worker loss.
	e := newEnv(t, envOpts{leaseTTL: calmLease})
	d := e.startDaemon(calm)

	const nConv, nTurns = 3, 3
	convs := make([]wire.Conversation, nConv)
	prompts := make([][]string, nConv)
	jobs := make([][]wire.Job, nConv)
	for c := range nConv {
		convs[c] = e.conversation(fmt.Sprintf("happy %d", c+1))
	}
	for k := range nTurns {
		for c := range nConv {
			p := fmt.Sprintf("conversation %d, turn %d\n!events 3", c+1, k+1)
			if c == 1 && k == 1 {
				p += fmt.Sprintf("\n!silent %v", 2*renewEvery+renewEvery/2)
			}
			prompts[c] = append(prompts[c], p)
			jobs[c] = append(jobs[c], e.send(convs[c].ID, p))
		}
	}

	for c := range nConv {
		for k, j := range jobs[c] {
			got := e.waitEnded(j.ID)
			if got.State != wire.JobSucceeded || got.AttemptCount != 1 || got.WorkerLostCount != 0 {
				t.Errorf("conversation %d turn %d: want succeeded on the first attempt; got %s", c+1, k+1, describeJob(got))
			}
			if got.Seq != int64(k+1) {
				t.Errorf("conversation %d: job %s has seq %d, want %d", c+1, j.ID, got.Seq, k+1)
			}
			if len(got.Attempts) == 1 && got.Attempts[0].LeaseOwner != e.host {
				t.Errorf("job %s: lease owner %q, want %q", j.ID, got.Attempts[0].LeaseOwner, e.host)
			}
			// The control plane's settled boundary carries the agent's own
			// native ordinal (R27): turn k of the conversation settles at k.
			if n, ok := settledNativeTurn(got); !ok || n != int64(k+1) {
				t.Errorf("conversation %d turn %d settled at native turn %d (found %v), want %d", c+1, k+1, n, ok, k+1)
			}
		}
		// In order: turn k+1 was claimed only after turn k had ended.
		for k := 1; k < nTurns; k++ {
			prev, next := e.job(jobs[c][k-1].ID), e.job(jobs[c][k].ID)
			if prev.EndedAt == nil || len(next.Attempts) == 0 || next.Attempts[0].ClaimedAt.Before(*prev.EndedAt) {
				t.Errorf("conversation %d: turn %d was claimed before turn %d ended:\n%s\n%s", c+1, k+1, k, describeJob(prev), describeJob(next))
			}
		}
		conv := e.conv(convs[c].ID)
		if conv.State != wire.ConversationUsable || conv.NativeTurn != nTurns {
			t.Errorf("conversation %d: state %s native turn %d, want usable at %d", c+1, conv.State, conv.NativeTurn, nTurns)
		}
		e.assertPromptsOnce(convs[c].ID, prompts[c]...)
		if pid, err := fleet.SupervisorPid(e.stateDir, convs[c].ID); err != nil || !alive(pid) {
			t.Errorf("conversation %d: the retained supervisor is not running (pid %d, %v)", c+1, pid, err)
		}
	}

	e.waitNoTurnChild()
	d.Signal(syscall.SIGTERM)
	if err := d.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if code := d.ExitCode(); code != 0 {
		t.Errorf("runnerd exited %d after SIGTERM, want 0", code)
	}
}

// settledNativeTurn is the native turn ordinal of the job's "settled" event.
func settledNativeTurn(j wire.Job) (int64, bool) {
	ev, ok := findEvent(j, "", "settled")
	if !ok {
		return 0, false
	}
	var b struct {
		NativeTurn int64 `json:"native_turn"`
	}
	return b.NativeTurn, json.Unmarshal(ev.Data, &b) == nil
}

// waitNoTurnChild waits until no `runnerd turn` of this test runs: each
// child exits right after its RESULT.
func (e *env) waitNoTurnChild() {
	e.t.Helper()
	ctx, cancel := e.waitCtx()
	defer cancel()
	var left []proc
	err := fleet.Poll(ctx, tick, "turn children to exit", func(context.Context) (bool, error) {
		left = e.turnChildren()
		return len(left) == 0, nil
	})
	if err != nil {
		e.t.Fatalf("%v: %v", err, left)
	}
}
