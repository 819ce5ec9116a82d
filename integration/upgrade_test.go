package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/runnerd/runnerd/internal/fleet"
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
