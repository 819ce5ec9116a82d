package integration

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// TestProcessTurnsRunTheLeanChild: with runnerd-child beside runnerd, as
// `make build` leaves them, the daemon says at start that its process
// turns run it (runnerd_turn_executable), and they do: the accepted turn's
// child and its conversation's supervisor are runnerd-child, and nothing
// but the daemon runs runnerd. The turn succeeds on its first attempt and
// its prompt reaches the agent once.
func TestProcessTurnsRunTheLeanChild(t *testing.T) {
	t.Parallel()
	if bins.RunnerdChild == "" {
		t.Fatalf("no runnerd-child beside %s", bins.Runnerd)
	}
	e := newEnv(t, envOpts{leanChild: true})
	d := e.startDaemon(nil)
	if _, err := d.AwaitOutput(0, regexp.MustCompile(`"msg":"runnerd_turn_executable".*"path":"`+regexp.QuoteMeta(e.child)+`"`), 20*time.Second); err != nil {
		t.Fatal(err)
	}

	conv := e.conversation("lean child")
	prompt := "lean child\n!sleep 1s"
	mark := d.Mark()
	j := e.send(conv.ID, prompt)
	m, err := d.AwaitOutput(mark, regexp.MustCompile(`"msg":"runnerd_turn_accepted".*"pid":(\d+)`), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(m[1])
	if argv := cmdline(t, pid); len(argv) < 2 || argv[0] != e.child || argv[1] != "turn" {
		t.Errorf("the turn child runs %q, want %s turn", argv, e.child)
	}
	if got := e.waitEnded(j.ID); got.State != wire.JobSucceeded || got.AttemptCount != 1 {
		t.Errorf("want succeeded on the first attempt; got %s", describeJob(got))
	}
	e.assertPromptsOnce(conv.ID, prompt)

	sup, err := fleet.SupervisorPid(e.stateDir, conv.ID)
	if err != nil {
		t.Fatal(err)
	}
	if argv := cmdline(t, sup); len(argv) < 2 || argv[0] != e.child || argv[1] != "supervise" {
		t.Errorf("the supervisor runs %q, want %s supervise", argv, e.child)
	}
	for _, p := range e.procs() {
		if p.Argv[0] == e.runnerd && p.Pid != d.Pid() {
			t.Errorf("%v runs runnerd below the daemon", p)
		}
	}
}

func cmdline(t *testing.T, pid int) []string {
	t.Helper()
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		t.Fatalf("pid %d: %v", pid, err)
	}
	return strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
}
