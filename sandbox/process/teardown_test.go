package process

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/internal/testbin"
)

// startTurn starts prompt in a fresh activation and reads its events until
// the one for which want returns true, returning the turn (still open) and
// every pid the events named (the started event's, the "escaped" one's).
func startTurn(t *testing.T, c *sandbox.Client, prompt string, want func(text string) bool) (*sandbox.Turn, []int) {
	t.Helper()
	ctx := context.Background()
	act, err := c.Activate(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := c.Run(ctx, act.ID, []string{demoAgent}, prompt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	var pids []int
	for {
		ev, err := tr.Next()
		if err != nil {
			t.Fatalf("turn %q ended before its event: %v", prompt, err)
		}
		var e struct {
			PID  int    `json:"pid"`
			Text string `json:"text"`
		}
		_ = json.Unmarshal(ev.Data, &e)
		if e.PID > 0 {
			pids = append(pids, e.PID)
		}
		if want(e.Text) {
			return tr, pids
		}
	}
}

// killAtEnd kills pid when the test ends, should it still run.
func killAtEnd(t *testing.T, pid int) {
	t.Cleanup(func() {
		_ = unix.Kill(pid, unix.SIGKILL)
		_ = testbin.WaitGone(pid, waitLimit)
	})
}

// S6: a deletion tears down a turn's agent that ignores SIGTERM: Remove
// returns only once the supervisor and the agent are proven gone, without
// a TeardownIncomplete.
func TestRemoveProvesAgentIgnoringSIGTERMGone(t *testing.T) {
	b := newBackend(t, t.TempDir())
	ctx := context.Background()
	sb, err := b.Ensure(ctx, spec("conv-td1"))
	if err != nil {
		t.Fatal(err)
	}
	st, err := sb.Client().Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, pids := startTurn(t, sb.Client(), "!ignoreterm\n!hang", func(text string) bool { return text == "hanging" })
	if len(pids) != 1 {
		t.Fatalf("pids named by the turn's events: %v, want the agent's", pids)
	}
	if err := b.Remove(ctx, "conv-td1"); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	for _, pid := range []int{st.PID, pids[0]} {
		if testbin.Alive(pid) {
			t.Errorf("pid %d still alive after Remove returned", pid)
		}
	}
}

// S6: a process that escaped its agent's process group and session (the
// supervisor's kill does not reach it) is held from before the teardown
// and named, by pid, in the TeardownIncomplete an idle eviction's Stop
// returns once the budget has passed; the supervisor itself is gone.
func TestStopNamesEscapedProcess(t *testing.T) {
	b, err := New(Config{StateDir: t.TempDir(), Command: []string{os.Args[0], "supervise"}, Env: testEnv,
		TeardownBudget: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cleanup(t, b, "conv-td2")
	sb, err := b.Ensure(ctx, spec("conv-td2"))
	if err != nil {
		t.Fatal(err)
	}
	st, err := sb.Client().Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The turn ends; what it started in a session of its own stays, a
	// child of the supervisor (a subreaper) now.
	tr, pids := startTurn(t, sb.Client(), "!escape", func(text string) bool { return text == "escaped" })
	if len(pids) != 2 {
		t.Fatalf("pids named by the turn's events: %v, want the agent's and the escaped one's", pids)
	}
	escaped := pids[1]
	killAtEnd(t, escaped)
	for {
		if _, err := tr.Next(); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			break
		}
	}
	if err := testbin.WaitGone(pids[0], waitLimit); err != nil {
		t.Fatal(err)
	}
	stopped, err := b.Stop(ctx, "conv-td2", func() bool { return true })
	var ti *sandbox.TeardownIncomplete
	if !stopped || !errors.As(err, &ti) {
		t.Fatalf("Stop: %v, %v; want stopped with a TeardownIncomplete", stopped, err)
	}
	if !slices.Equal(ti.PIDs, []int{escaped}) || ti.Budget != 300*time.Millisecond {
		t.Fatalf("TeardownIncomplete %+v, want pid %d alone and the budget", ti, escaped)
	}
	if testbin.Alive(st.PID) {
		t.Errorf("the supervisor (pid %d) still runs after Stop", st.PID)
	}
	if !testbin.Alive(escaped) {
		t.Errorf("the escaped process %d is named but gone", escaped)
	}
}

// S6: the same in a deletion, with the agent still running its turn: the
// agent goes with its process group, the escaped process is named, the
// sandbox directory is deleted all the same.
func TestRemoveNamesEscapedProcess(t *testing.T) {
	b, err := New(Config{StateDir: t.TempDir(), Command: []string{os.Args[0], "supervise"}, Env: testEnv,
		TeardownBudget: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sb, err := b.Ensure(ctx, spec("conv-td3"))
	if err != nil {
		t.Fatal(err)
	}
	_, pids := startTurn(t, sb.Client(), "!escape\n!hang", func(text string) bool { return text == "hanging" })
	if len(pids) != 2 {
		t.Fatalf("pids named by the turn's events: %v, want the agent's and the escaped one's", pids)
	}
	killAtEnd(t, pids[1])
	err = b.Remove(ctx, "conv-td3")
	var ti *sandbox.TeardownIncomplete
	if !errors.As(err, &ti) || !slices.Equal(ti.PIDs, []int{pids[1]}) {
		t.Fatalf("Remove: %v; want a TeardownIncomplete naming pid %d alone", err, pids[1])
	}
	if testbin.Alive(pids[0]) {
		t.Errorf("the agent (pid %d) still runs after Remove", pids[0])
	}
	if _, err := os.Stat(b.Dir("conv-td3")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("sandbox directory still there: %v", err)
	}
}
