package integration

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/wire"
)

// installBinary puts from at to the way an upgrade does: a new file renamed
// over the old one, so that processes still running the old one keep it.
func installBinary(t *testing.T, from, to string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(to), ".install-"+filepath.Base(to))
	if err := linkOrCopy(from, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, to); err != nil {
		t.Fatal(err)
	}
}

// runsFile reports whether process pid runs the file at path now.
func runsFile(pid int, path string) bool {
	exe, err1 := os.Stat(fmt.Sprintf("/proc/%d/exe", pid))
	file, err2 := os.Stat(path)
	return err1 == nil && err2 == nil && os.SameFile(exe, file)
}

// TestUpgradeFromPreviousRelease (P5, issue 12 §2): the previous release's
// runnerd (built from git history, previousRelease) runs a long, silent
// admitted turn; it is killed with SIGKILL, the binary is replaced by this
// build and the new daemon starts on the same state directory. It
// re-attaches to the previous release's turn child (protocol v3,
// runnerd_turn_reattached) and the turn completes as if nothing had
// happened: one attempt, the prompt once, the conversation usable. The
// conversation's supervisor, started by the previous release, speaks the
// unversioned supervisor protocol: the next turn replaces it while it is
// idle (sandbox_supervisor_replaced, outdated_protocol), over the same
// sandbox and state, and runs at the next native turn.
func TestUpgradeFromPreviousRelease(t *testing.T) {
	t.Parallel()
	old := previousRunnerd(t)
	e := newEnv(t, envOpts{})
	installBinary(t, old, e.runnerd)
	d := e.startDaemon(func(c *fleet.DaemonConfig) { c.LeaseTTL = reattachLease })

	c := e.conversation("upgraded mid-turn")
	const prompt = "a long, quiet turn across an upgrade\n!sleep 3s"
	j := e.send(c.ID, prompt)
	e.waitPrompts(c.ID, 1)
	children := e.turnChildren()
	if len(children) != 1 || !runsFile(children[0].Pid, e.runnerd) {
		t.Fatalf("want one turn child of the previous release; got %v", children)
	}
	e.kill9(d)
	installBinary(t, bins.Runnerd, e.runnerd)
	if runsFile(children[0].Pid, e.runnerd) || !alive(children[0].Pid) {
		t.Fatalf("the previous release's turn child did not outlive its daemon, or runs the new binary")
	}
	d = e.restart(d)
	assertReattached(t, d, 0, j.ID)
	e.assertCompletedOnce(j.ID, c.ID, 1)

	const next = "the first turn after the upgrade"
	j2 := e.send(c.ID, next)
	e.assertCompletedOnce(j2.ID, c.ID, 2)
	e.assertPromptsOnce(c.ID, prompt, next)
	if !regexp.MustCompile(`"msg":"sandbox_supervisor_replaced".*"reason":"outdated_protocol"`).MatchString(d.Output()) {
		t.Errorf("the previous release's supervisor was not replaced for its protocol version")
	}
}

// TestK13QuarantinedUnderThePreviousRelease (K13, P5): the previous
// release's daemon is killed (SIGKILL) while its agent works on an admitted
// prompt, and stays down until the reaper has superseded the attempt: the
// conversation is quarantined under that release, whose supervisor kept no
// retained record. The binary is replaced by this build and the daemon
// restarted. The next message's turn replaces the idle supervisor
// (outdated_protocol); the new one takes the state over
// (supervisor_state_taken_over: the turns before ran unrecorded, then the
// state-version marker), and the turn verifies the interrupted one as that
// release did — the exact container and the boundary — and resumes the
// session past it (native turn 3): not LOST, the interrupted job shown as
// interrupted, every prompt once.
func TestK13QuarantinedUnderThePreviousRelease(t *testing.T) {
	t.Parallel()
	old := previousRunnerd(t)
	e := newEnv(t, envOpts{})
	installBinary(t, old, e.runnerd)
	d := e.startDaemon(nil)
	c := e.conversation("quarantined under the previous release")
	const first, cut = "the first turn", "a long turn cut short\n!silent 10m"
	if j := e.waitEnded(e.send(c.ID, first).ID); j.State != wire.JobSucceeded {
		t.Fatalf("first turn: %s", describeJob(j))
	}
	j := e.send(c.ID, cut)
	e.waitPrompts(c.ID, 2)
	sup, err := fleet.SupervisorPid(e.stateDir, c.ID)
	if err != nil || !runsFile(sup, e.runnerd) {
		t.Fatalf("want the previous release's supervisor; pid %d (%v)", sup, err)
	}
	e.kill9(d)
	e.waitJob(j.ID, "superseded", func(j wire.Job) bool {
		return len(j.Attempts) == 1 && j.Attempts[0].State == wire.AttemptSuperseded
	})
	e.quarantined(c.ID, j.ID)
	state := filepath.Join(fleet.SandboxDir(e.stateDir, c.ID), "supervisor-state")
	for _, name := range []string{sandbox.RetainedFile, sandbox.StateVersionFile} {
		if _, err := os.Stat(filepath.Join(state, name)); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("the previous release's supervisor state has %s (%v): not the state this test is about", name, err)
		}
	}

	installBinary(t, bins.Runnerd, e.runnerd)
	d = e.restart(d)
	const third = "the first message after the upgrade"
	e.resumes(c.ID, third, 0, 3)
	e.assertPromptsOnce(c.ID, first, cut, third)
	if j := e.job(j.ID); j.State != wire.JobFailed || !strings.Contains(j.Reason, "interrupted") || len(j.Attempts) != 1 {
		t.Errorf("the interrupted job after the resume: %s", describeJob(j))
	}
	if !regexp.MustCompile(`"msg":"sandbox_supervisor_replaced".*"reason":"outdated_protocol"`).MatchString(d.Output()) {
		t.Errorf("the previous release's supervisor was not replaced for its protocol version")
	}
	if b, err := os.ReadFile(filepath.Join(state, sandbox.StateVersionFile)); err != nil || strings.TrimSpace(string(b)) != "2" {
		t.Errorf("the state taken over is not marked: %q, %v", b, err)
	}
}
