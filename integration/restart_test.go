package integration

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// TestKill9MidTurnThenRestart kills the daemon with SIGKILL while it holds
// three conversations in three different states, then starts it again on
// the same state directory:
//
//   - idle: its first turn finished before the kill; its supervisor still
//     runs. After the restart the same supervisor (same pid) is found again
//     and serves turn 2, whose native ordinal continues at 2 (P5).
//   - admitted: its agent had the prompt when the daemon died. The turn
//     child outlives the daemon and the new one re-attaches to it (P5): the
//     turn completes after one attempt, the conversation stays usable.
//   - preparing: its turn child had accepted but was still preparing the
//     sandbox (the test holds the sandbox's lock), never admitted. It is
//     re-attached too and completes without a worker loss (P5).
//
// Every prompt reaches its agent exactly once (the demo agent's
// transcripts).
func TestKill9MidTurnThenRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	// A longer lease than the other tests': the restarted daemon must find
	// the leases of the dead one still valid, however slow the machine, to
	// report them itself rather than leave them to the reaper.
	d := e.startDaemon(func(c *fleet.DaemonConfig) { c.LeaseTTL = 5 * time.Second })

	idle := e.conversation("idle")
	idleFirst := "first turn of the idle conversation"
	if j := e.waitEnded(e.send(idle.ID, idleFirst).ID); j.State != wire.JobSucceeded {
		t.Fatalf("idle conversation, turn 1: %s", describeJob(j))
	}
	idleSup, err := fleet.SupervisorPid(e.stateDir, idle.ID)
	if err != nil || !alive(idleSup) {
		t.Fatalf("the idle conversation's supervisor is not running: pid %d, %v", idleSup, err)
	}

	admitted := e.conversation("admitted")
	// Long enough to be running still when the daemon is killed after the
	// preparing turn below is set up, on a loaded machine too.
	const admittedPrompt = "a long turn the restart does not cut short\n!sleep 8s"
	admittedJob := e.send(admitted.ID, admittedPrompt)
	e.waitPrompts(admitted.ID, 1)
	admittedAgents := e.agents(admitted.ID)
	admittedSup, err := fleet.SupervisorPid(e.stateDir, admitted.ID)
	if len(admittedAgents) != 1 || err != nil {
		t.Fatalf("the admitted conversation's agent and supervisor: %v, %v", admittedAgents, err)
	}

	preparing := e.conversation("preparing")
	unlock := holdSandboxLock(t, e.stateDir, preparing.ID)
	const preparingPrompt = "a turn whose sandbox is slow to come\n!events 2"
	preparingJob := e.send(preparing.ID, preparingPrompt)
	e.waitLockWaiter(preparing.ID)

	d.Signal(syscall.SIGKILL)
	if err := d.Wait(waitFor); err != nil {
		t.Fatal(err)
	}
	if n := len(e.turnChildren()); n != 2 {
		t.Errorf("%d turn children outlived the daemon, want both (P5)", n)
	}
	if !alive(admittedAgents[0].Pid) {
		t.Errorf("the admitted turn's agent died with the daemon")
	}

	d = e.restart(d)
	unlock() // the re-attached child may go on now

	j := e.waitEnded(admittedJob.ID)
	if j.State != wire.JobSucceeded || j.AttemptCount != 1 || j.WorkerLostCount != 0 {
		t.Errorf("admitted turn: want succeeded after one attempt, re-attached; got %s", describeJob(j))
	}
	if c := e.conv(admitted.ID); c.State != wire.ConversationUsable || c.NativeTurn != 1 {
		t.Errorf("admitted conversation: %s at native turn %d, want usable at 1", c.State, c.NativeTurn)
	}
	if pid, err := fleet.SupervisorPid(e.stateDir, admitted.ID); err != nil || pid != admittedSup {
		t.Errorf("the admitted conversation's supervisor changed: pid %d before, %d after (%v)", admittedSup, pid, err)
	}

	j = e.waitEnded(preparingJob.ID)
	if j.State != wire.JobSucceeded || j.AttemptCount != 1 || j.WorkerLostCount != 0 {
		t.Errorf("preparing turn: want succeeded with one attempt and no worker loss; got %s", describeJob(j))
	}
	if c := e.conv(preparing.ID); c.State != wire.ConversationUsable || c.NativeTurn != 1 {
		t.Errorf("preparing conversation: %s at native turn %d, want usable at 1", c.State, c.NativeTurn)
	}

	idleSecond := "second turn of the idle conversation"
	if j := e.waitEnded(e.send(idle.ID, idleSecond).ID); j.State != wire.JobSucceeded {
		t.Errorf("idle conversation, turn 2 after the restart: %s", describeJob(j))
	}
	if c := e.conv(idle.ID); c.State != wire.ConversationUsable || c.NativeTurn != 2 {
		t.Errorf("idle conversation: %s at native turn %d, want usable at 2", c.State, c.NativeTurn)
	}
	if pid, err := fleet.SupervisorPid(e.stateDir, idle.ID); err != nil || pid != idleSup || !alive(pid) {
		t.Errorf("the idle conversation's supervisor was not found again: pid %d before, %d after (%v)", idleSup, pid, err)
	}

	e.assertPromptsOnce(idle.ID, idleFirst, idleSecond)
	e.assertPromptsOnce(admitted.ID, admittedPrompt)
	e.assertPromptsOnce(preparing.ID, preparingPrompt)
}

// holdSandboxLock takes the process backend's lock of a conversation's
// sandbox (creating its directory as the backend would), so that a turn
// child accepts the turn and then waits in Ensure, before anything is
// recorded or admitted. The returned function releases it (idempotent).
func holdSandboxLock(t *testing.T, stateDir, convID string) func() {
	t.Helper()
	dir := fleet.SandboxDir(stateDir, convID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	done := false
	release := func() {
		if !done {
			done = true
			_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
			f.Close()
		}
	}
	t.Cleanup(release)
	return release
}

// waitLockWaiter waits until one of this test's turn children blocks on
// the sandbox lock of convID (a "->" line of /proc/locks on its inode).
func (e *env) waitLockWaiter(convID string) {
	e.t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(fleet.SandboxDir(e.stateDir, convID), "lock"), &st); err != nil {
		e.t.Fatal(err)
	}
	suffix := fmt.Sprintf(":%d", st.Ino)
	ctx, cancel := e.waitCtx()
	defer cancel()
	err := fleet.Poll(ctx, tick, "a turn child to wait on the sandbox lock", func(context.Context) (bool, error) {
		children := map[int]bool{}
		for _, p := range e.turnChildren() {
			children[p.Pid] = true
		}
		f, err := os.Open("/proc/locks")
		if err != nil {
			return false, err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// "2: -> FLOCK  ADVISORY  WRITE 4242 00:2d:1234 0 EOF"
			fields := strings.Fields(sc.Text())
			if len(fields) < 7 || fields[1] != "->" || fields[2] != "FLOCK" {
				continue
			}
			pid, _ := strconv.Atoi(fields[5])
			if children[pid] && strings.HasSuffix(fields[6], suffix) {
				return true, nil
			}
		}
		return false, sc.Err()
	})
	if err != nil {
		e.t.Fatal(err)
	}
}
