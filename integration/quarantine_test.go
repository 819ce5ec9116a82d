package integration

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/wire"
)

// K13 with real processes (daemon, turn children, supervisors, the demo
// agent) on the process backend: each way an admitted turn ends without a
// recorded settlement leaves its conversation quarantined, never LOST, and
// the next message either resumes the same native session — the
// supervisor found again, the ordinal continuing past the interrupted
// turn — or, when the retained sandbox is not the one the interrupted turn
// left, reports the conversation unrecoverable. No prompt ever reaches the
// agent twice, and the prompt of an unrecoverable conversation's message
// never reaches it at all.

// quarantined waits for the interrupted job to end and checks what the
// owner and the operator see: the job failed with plain words saying it
// was interrupted, one attempt (never replayed), the conversation
// quarantined and naming it.
func (e *env) quarantined(convID, jobID string) wire.Job {
	e.t.Helper()
	j := e.waitEnded(jobID)
	if j.State != wire.JobFailed || len(j.Attempts) != 1 || !strings.Contains(j.Reason, "interrupted") {
		e.t.Fatalf("interrupted turn: want failed once with a reason that says interrupted; got %s", describeJob(j))
	}
	for _, word := range []string{"lease", "attempt", "settle", "quarantine", "worker"} {
		if strings.Contains(strings.ToLower(j.Reason), word) {
			e.t.Errorf("the owner's words %q say %q", j.Reason, word)
		}
	}
	c := e.conv(convID)
	if c.State != wire.ConversationQuarantined || c.InterruptedJobID != jobID || c.LostReason != "" {
		e.t.Fatalf("conversation after the interrupted turn: %+v, want quarantined naming %s", c, jobID)
	}
	return j
}

// resumes sends the next message and checks that it ran on the same
// native session: it succeeded, recorded the verified boundary
// (conversation_resumed), and the conversation is usable again at native
// turn want.
func (e *env) resumes(convID, prompt string, supervisor int, want int64) {
	e.t.Helper()
	j := e.waitEnded(e.send(convID, prompt).ID)
	if j.State != wire.JobSucceeded || len(j.Attempts) != 1 {
		e.t.Fatalf("the message after the interruption: %s", describeJob(j))
	}
	resumed := 0
	for _, ev := range e.job(j.ID).Events {
		if ev.Type == "conversation_resumed" {
			resumed++
		}
	}
	if resumed != 1 {
		e.t.Errorf("the resuming turn has %d conversation_resumed events, want 1", resumed)
	}
	if c := e.conv(convID); c.State != wire.ConversationUsable || c.NativeTurn != want || c.InterruptedJobID != "" {
		e.t.Errorf("conversation after the resume: %s at native turn %d (interrupted %q), want usable at %d", c.State, c.NativeTurn, c.InterruptedJobID, want)
	}
	if supervisor == 0 {
		return // a new supervisor, over the same state
	}
	if pid, err := fleet.SupervisorPid(e.stateDir, convID); err != nil || pid != supervisor || !alive(pid) {
		e.t.Errorf("the supervisor was not found again: pid %d before, %d after (%v)", supervisor, pid, err)
	}
}

// unrecoverable sends the next message and checks that it is refused as
// unrecoverable before admission: the job failed, the conversation is
// LOST in plain words and takes no further message.
func (e *env) unrecoverable(convID, prompt string) {
	e.t.Helper()
	j := e.waitEnded(e.send(convID, prompt).ID)
	if j.State != wire.JobFailed || j.Admitted || len(j.Attempts) != 1 {
		e.t.Fatalf("the message to an unverifiable conversation: %s", describeJob(j))
	}
	c := e.conv(convID)
	if c.State != wire.ConversationLost || !strings.Contains(c.LostReason, "interrupted") {
		e.t.Fatalf("conversation: %s (%q), want lost in plain words", c.State, c.LostReason)
	}
	if _, err := e.user.Send(e.ctx, convID, "and now?"); err == nil {
		e.t.Error("a LOST conversation took a new message")
	}
}

// TestK13SettlementTriesUsedUp: every settlement try of an admitted turn
// is refused with 503, so its tries run out (R24) after the agent
// completed. The conversation is quarantined; the next message resumes the
// same supervisor at the boundary the supervisor recorded for the
// interrupted turn (native turn 1), and its own turn continues at 2.
func TestK13SettlementTriesUsedUp(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{faults: true})
	e.startDaemon(nil)
	c := e.conversation("settlement tries used up")
	const first = "a turn whose settlement never gets through\n!events 2"
	e.faults.refuse(wire.OpSettlement, http.StatusServiceUnavailable)
	j := e.send(c.ID, first)
	e.quarantined(c.ID, j.ID)
	if n := len(e.faults.calls(j.ID, wire.OpSettlement)); n < 3 {
		t.Errorf("%d settlement tries, want R24's three", n)
	}
	e.faults.refuse("", 0)
	sup, err := fleet.SupervisorPid(e.stateDir, c.ID)
	if err != nil || !alive(sup) {
		t.Fatalf("the quarantined conversation's supervisor is not running: %d, %v", sup, err)
	}
	const second = "the message after it"
	e.resumes(c.ID, second, sup, 2)
	e.assertPromptsOnce(c.ID, first, second)
}

// TestK13DaemonDownPastTheLease: the daemon is killed (SIGKILL) while the
// agent works on an admitted prompt and stays down until the reaper has
// superseded the attempt. The conversation is quarantined, its sandbox
// kept; after the restart the next message resumes the same supervisor
// past the interrupted turn, which the agent had begun (native turn 2), at
// native turn 3.
func TestK13DaemonDownPastTheLease(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	d := e.startDaemon(nil)
	c := e.conversation("daemon down past the lease")
	const first, cut = "the first turn", "a long turn cut short\n!silent 10m"
	if j := e.waitEnded(e.send(c.ID, first).ID); j.State != wire.JobSucceeded {
		t.Fatalf("first turn: %s", describeJob(j))
	}
	j := e.send(c.ID, cut)
	e.waitPrompts(c.ID, 2)
	d.Signal(syscall.SIGKILL)
	if err := d.Wait(waitFor); err != nil {
		t.Fatal(err)
	}
	e.waitJob(j.ID, "superseded", func(j wire.Job) bool {
		return len(j.Attempts) == 1 && j.Attempts[0].State == wire.AttemptSuperseded
	})
	e.quarantined(c.ID, j.ID)
	sup, err := fleet.SupervisorPid(e.stateDir, c.ID)
	if err != nil || !alive(sup) {
		t.Fatalf("the quarantined conversation's supervisor is not running: %d, %v", sup, err)
	}
	e.restart(d)
	const third = "the message after the restart"
	e.resumes(c.ID, third, sup, 3)
	e.assertPromptsOnce(c.ID, first, cut, third)
}

// TestK13FinishLost: the settlement of an admitted turn is refused, and
// its finish then never answered, until the daemon is killed and stays
// down past the lease: the finish is lost after settlement was attempted.
// The conversation is quarantined. Then the retained sandbox is changed
// while no turn runs — its supervisor's recorded boundary rewritten, or
// the sandbox's identity replaced — and the next message reports the
// conversation unrecoverable without its prompt reaching the agent. So
// does a supervisor over a state that keeps the boundary but not the
// retained receipt of the interrupted activation (R26): a boundary that
// looks right is not evidence. With the sandbox left as it was, the next
// message resumes it — and after a restart of the supervisor over its
// state, whose receipt record survives, it resumes on the new supervisor.
func TestK13FinishLost(t *testing.T) {
	t.Parallel()
	for _, change := range []string{"nothing", "supervisor restarted", "boundary changed", "receipt gone", "container replaced"} {
		t.Run(strings.ReplaceAll(change, " ", "_"), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, envOpts{faults: true})
			d := e.startDaemon(nil)
			c := e.conversation("finish lost: " + change)
			const first = "a turn whose finish is lost\n!events 1"
			e.faults.refuse(wire.OpSettlement, http.StatusServiceUnavailable)
			e.faults.hang(wire.OpFinish)
			j := e.send(c.ID, first)
			e.waitJob(j.ID, "its finish sent", func(wire.Job) bool { return len(e.faults.calls(j.ID, wire.OpFinish)) > 0 })
			d.Signal(syscall.SIGKILL)
			if err := d.Wait(waitFor); err != nil {
				t.Fatal(err)
			}
			e.waitJob(j.ID, "superseded", func(j wire.Job) bool {
				return len(j.Attempts) == 1 && j.Attempts[0].State == wire.AttemptSuperseded
			})
			e.quarantined(c.ID, j.ID)
			e.faults.refuse("", 0)
			e.faults.hang("")
			sup, err := fleet.SupervisorPid(e.stateDir, c.ID)
			if err != nil || !alive(sup) {
				t.Fatalf("the quarantined conversation's supervisor is not running: %d, %v", sup, err)
			}
			dir := fleet.SandboxDir(e.stateDir, c.ID)
			switch change {
			case "boundary changed":
				stopSupervisor(t, sup)
				if err := os.WriteFile(filepath.Join(dir, "supervisor-state", sandbox.NativeTurnFile), []byte("7\n"), 0o600); err != nil {
					t.Fatal(err)
				}
			case "supervisor restarted":
				stopSupervisor(t, sup)
				sup = 0
			case "receipt gone":
				stopSupervisor(t, sup)
				if err := os.Remove(filepath.Join(dir, "supervisor-state", sandbox.RetainedFile)); err != nil {
					t.Fatal(err)
				}
			case "container replaced":
				stopSupervisor(t, sup)
				if err := os.Remove(filepath.Join(dir, "id")); err != nil {
					t.Fatal(err)
				}
			}
			e.restart(d)
			const next = "the message after it"
			if change == "nothing" || change == "supervisor restarted" {
				e.resumes(c.ID, next, sup, 2)
				e.assertPromptsOnce(c.ID, first, next)
				return
			}
			e.unrecoverable(c.ID, next)
			// Never the unrecoverable message's prompt (its job was never
			// admitted); the daemon may be removing the LOST sandbox.
			e.assertLostPromptOnce(c.ID, first, e.job(j.ID))
		})
	}
}

// stopSupervisor kills a sandbox's supervisor while no turn runs, as a
// host reboot would, and waits until it is gone.
func stopSupervisor(t *testing.T, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := waitGone(pid, waitFor); err != nil {
		t.Fatal(err)
	}
}

// TestK13SupervisorKilledMidTurn: the supervisor dies while an admitted
// turn runs, its prompt already with the agent — no sandbox changed, only
// a process gone. The conversation is quarantined, and the next message
// resumes it on a new supervisor over the same state: the record of the
// interrupted activation was written before the prompt reached the agent,
// so the restarted supervisor presents that one, not the turn before it
// (the chaos campaign's avoidable LOST with retained_receipt_mismatch).
func TestK13SupervisorKilledMidTurn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.startDaemon(nil)
	c := e.conversation("supervisor killed mid-turn")
	e.waitEnded(e.send(c.ID, "a settled turn\n!events 1").ID)
	j := e.send(c.ID, "a turn whose supervisor dies\n!events 1\n!sleep 10m")
	e.waitPrompts(c.ID, 2) // the prompt is with the agent
	// and its session counted the turn: the agent appends the prompt to its
	// transcript first and moves its turn on after, so the kill waits for
	// the event it sends once both are done.
	e.waitJob(j.ID, "the agent's turn.started", func(j wire.Job) bool {
		_, ok := findEvent(j, "", "turn.started")
		return ok
	})
	sup, err := fleet.SupervisorPid(e.stateDir, c.ID)
	if err != nil || !alive(sup) {
		t.Fatalf("the conversation's supervisor is not running: %d, %v", sup, err)
	}
	stopSupervisor(t, sup)
	e.quarantined(c.ID, j.ID)
	// The killed turn reached the agent, whose session counted it: the
	// next turn is its third.
	e.resumes(c.ID, "the message after it", 0, 3)
}
