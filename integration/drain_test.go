package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// TestDrainKeepsRenewing drains a daemon (`runnerd drain`: SIGUSR1) in the
// middle of a turn that stays silent for well over a lease. The daemon
// stops claiming — a message sent during the drain stays queued — yet
// keeps renewing the running turn's lease (R13), so the turn finishes and
// its success is accepted long after the lease it held at the drain would
// have run out; Admin → Servers shows the host draining; then the daemon
// exits 0.
func TestDrainKeepsRenewing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	d := e.startDaemon(nil)

	c := e.conversation("draining")
	quiet := 2 * leaseTTL
	prompt := fmt.Sprintf("finish me\n!silent %v\n!events 2", quiet)
	j := e.send(c.ID, prompt)
	e.waitPrompts(c.ID, 1)
	before := e.job(j.ID).Attempts[0]

	termAt := time.Now()
	drained := e.drain(d)
	e.waitServer("draining", func(s wire.Server) bool { return s.Draining })
	other := e.conversation("not claimed during the drain")
	queued := e.send(other.ID, "wait for the next daemon")

	if err := d.Wait(waitFor); err != nil {
		t.Fatal(err)
	}
	if code := d.ExitCode(); code != 0 {
		t.Errorf("runnerd exited %d after its drain, want 0", code)
	}
	if out := drained(); !strings.Contains(out, fmt.Sprintf("runnerd (pid %d) drained and exited", d.Pid())) {
		t.Errorf("runnerd drain said %q", out)
	}
	got := e.job(j.ID)
	if got.State != wire.JobSucceeded || len(got.Attempts) != 1 {
		t.Fatalf("the drained turn: want succeeded on its one attempt; got %s", describeJob(got))
	}
	a := got.Attempts[0]
	if a.EndedAt == nil || a.EndedAt.Sub(termAt) < leaseTTL {
		t.Errorf("the turn ended %v after the drain began; it was meant to outlast a lease (%v)", a.EndedAt.Sub(termAt), leaseTTL)
	}
	// Renewed during the drain: the lease the store holds reaches past the one
	// the attempt had when the drain began.
	if !a.LeaseExpiresAt.After(before.LeaseExpiresAt.Add(leaseTTL / 2)) {
		t.Errorf("the lease was not renewed during the drain: %s before it, %s at the end",
			before.LeaseExpiresAt.Format(time.StampMilli), a.LeaseExpiresAt.Format(time.StampMilli))
	}
	if q := e.job(queued.ID); q.State != wire.JobQueued || len(q.Attempts) != 0 {
		t.Errorf("a turn was claimed during the drain: %s", describeJob(q))
	}
	e.assertPromptsOnce(c.ID, prompt)
}

// TestCancelFromUserAPIStopsRunningTurn first cancels a turn still queued
// behind another: it ends at once, never claimed (P7). Then it cancels the
// running, admitted turn, whose agent would hang for ever: the cancel
// reaches the daemon (P7), the daemon stops the turn while it still holds
// the lease (R13), the child asks the supervisor to interrupt the agent,
// which settles an interrupted boundary, and the child settles it with the
// control plane (K10): the job ends cancelled on its one attempt, its owner
// reads that the reply was interrupted at their request (R32), the agent
// and the turn child are gone, and the conversation stays usable — its next
// message runs on the same native session, the native turn ordinal going
// on from the interrupted turn, every prompt delivered once. The daemon
// goes on claiming.
func TestCancelFromUserAPIStopsRunningTurn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	// The interrupt (SIGINT, a grace, the settlement) runs within the stop
	// grace, as with the default of 10 s.
	e.startDaemon(func(c *fleet.DaemonConfig) { c.StopGrace = 10 * time.Second })

	c := e.conversation("cancelled")
	const hang = "never ends\n!hang"
	j := e.send(c.ID, hang)
	e.waitPrompts(c.ID, 1)
	agents := e.agents(c.ID)
	if len(agents) != 1 {
		t.Fatalf("want one agent running, got %v", agents)
	}
	// P7: a turn that has not started is cancelled at once.
	queued := e.send(c.ID, "queued behind the hanging turn")
	if got, err := e.user.Cancel(e.ctx, queued.ID); err != nil || got.State != wire.JobCancelled || len(got.Attempts) != 0 {
		t.Errorf("cancel of a queued turn: want cancelled at once with no attempt; got %s, %v", describeJob(got), err)
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
	t.Logf("agent stopped %v after the cancel; job ended %v after it", gone.Seen.Sub(cancelAt), got.EndedAt.Sub(cancelAt))
	if got.State != wire.JobCancelled || got.Outcome != wire.OutcomeCancelled || len(got.Attempts) != 1 {
		t.Fatalf("want cancelled on its one attempt; got %s", describeJob(got))
	}
	if a := got.Attempts[0]; a.State != wire.AttemptFinished {
		t.Errorf("the cancelled attempt is %s, want finished (reported by the daemon, not reaped)", a.State)
	}
	if !strings.Contains(got.Reason, "interrupted at your request") {
		t.Errorf("the owner reads %q, want that the reply was interrupted at their request", got.Reason)
	}
	if ev, ok := findEvent(got, got.Attempts[0].ID, "settled"); !ok || !strings.Contains(string(ev.Data), `"interrupted":true`) {
		t.Errorf("no interrupted settlement: %s", describeJob(got))
	}
	e.waitNoTurnChild()
	cv := e.conv(c.ID)
	if cv.State != wire.ConversationUsable || cv.NativeTurn != 1 {
		t.Fatalf("after the cancel the conversation is %s at native turn %d, want usable at 1", cv.State, cv.NativeTurn)
	}

	// The same native session goes on.
	next := e.waitEnded(e.send(c.ID, "after the cancel").ID)
	if next.State != wire.JobSucceeded || len(next.Attempts) != 1 {
		t.Fatalf("the message after the cancel: %s", describeJob(next))
	}
	if cv := e.conv(c.ID); cv.State != wire.ConversationUsable || cv.NativeTurn != 2 {
		t.Errorf("after the next message the conversation is %s at native turn %d, want usable at 2", cv.State, cv.NativeTurn)
	}
	e.assertPromptsOnce(c.ID, hang, "after the cancel")

	c2 := e.conversation("after the cancel")
	if j2 := e.waitEnded(e.send(c2.ID, "still claiming").ID); j2.State != wire.JobSucceeded {
		t.Errorf("the daemon stopped claiming after a cancel: %s", describeJob(j2))
	}
}
