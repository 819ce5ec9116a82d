package integration

import (
	"fmt"
	"regexp"
	"syscall"
	"testing"

	"github.com/runnerd/runnerd/runner"
	"github.com/runnerd/runnerd/wire"
)

// TestSIGHUPKeepsEveryTurn sends SIGHUP, in the middle of a turn that
// stays silent for well over a lease, to every runnerd process of the host
// — the daemon, the turn child and the supervisor — as
// `systemctl kill -s HUP runnerd` would (K11). Nothing ends: the daemon
// says once that it ignored the signal, the turn succeeds on its one
// attempt with its prompt delivered once, and the same daemon goes on
// claiming (the next message runs on the same native session).
func TestSIGHUPKeepsEveryTurn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	d := e.startDaemon(nil)

	c := e.conversation("hung up on")
	prompt := fmt.Sprintf("keep going\n!silent %v\n!events 2", 2*leaseTTL)
	j := e.send(c.ID, prompt)
	e.waitPrompts(c.ID, 1)

	var hupped []proc
	for _, p := range e.procs() {
		if p.Argv[0] == e.runnerd && p.Pid != d.Pid() {
			hupped = append(hupped, p)
		}
	}
	if len(hupped) < 2 {
		t.Fatalf("want the turn child and the supervisor running beside the daemon, got %v", hupped)
	}
	mark := d.Mark()
	d.Signal(syscall.SIGHUP)
	for _, p := range hupped {
		if err := syscall.Kill(p.Pid, syscall.SIGHUP); err != nil {
			t.Fatalf("SIGHUP %v: %v", p, err)
		}
	}
	record := regexp.MustCompile(`"msg":"` + runner.MsgHangupIgnored + `".*"running":1`)
	if _, err := d.AwaitOutput(mark, record, waitFor); err != nil {
		t.Fatalf("no %s record naming the running turn: %v", runner.MsgHangupIgnored, err)
	}

	got := e.waitEnded(j.ID)
	if got.State != wire.JobSucceeded || len(got.Attempts) != 1 {
		t.Fatalf("the turn running at SIGHUP: want succeeded on its one attempt; got %s", describeJob(got))
	}
	for _, p := range hupped {
		if p.Argv[1] == "supervise" && !alive(p.Pid) {
			t.Errorf("the supervisor %v did not survive SIGHUP", p)
		}
	}
	select {
	case <-d.Done():
		t.Fatalf("the daemon exited after SIGHUP (%v)", d.Err())
	default:
	}
	next := e.waitEnded(e.send(c.ID, "after the hangup").ID)
	if next.State != wire.JobSucceeded {
		t.Fatalf("the daemon stopped working after SIGHUP: %s", describeJob(next))
	}
	e.assertPromptsOnce(c.ID, prompt, "after the hangup")
}
