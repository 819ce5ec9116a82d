package supervisor

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/internal/testbin"
)

// S6, a fence: the turn's agent, which ignores SIGTERM, is gone once the
// newer activation has its answer (the supervisor's group kill, not the
// signal it ignores), and nothing of it is named in a
// sandbox_teardown_incomplete record.
func TestS6FencedAgentIgnoringSIGTERMProvenGone(t *testing.T) {
	s := startServe(t)
	ctx := context.Background()
	a1, err := s.c.Activate(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	turn, err := s.c.Run(ctx, a1.ID, []string{demoAgent}, "!ignoreterm\n!hang")
	if err != nil {
		t.Fatal(err)
	}
	defer turn.Close()
	pid := eventField[int](t, nextEvent(t, turn), "pid")
	if _, err := s.c.Activate(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if testbin.Alive(pid) {
		t.Fatalf("the fenced agent %d (ignoring SIGTERM) outlived the fence", pid)
	}
	if err := streamEnd(turn); !errors.Is(err, sandbox.ErrFenced) {
		t.Fatalf("fenced stream ended with %v, want ErrFenced", err)
	}
	s.rec.waitFor(t, RecordTurnStopped, 1)
	runTurn(t, s.c, "after the fence")
	if got := s.rec.attrs(RecordTeardownIncomplete); len(got) != 0 {
		t.Fatalf("%s after a fence whose agent is gone: %v", RecordTeardownIncomplete, got)
	}
}

// S6, a cancel: a process the agent started in a session of its own (the
// stop's group kill does not reach it) was held from the stop, and is
// named by pid in a sandbox_teardown_incomplete record (teardown cancel)
// once the budget has passed; the agent itself is gone.
func TestS6CancelNamesEscapedProcess(t *testing.T) {
	const budget = 300 * time.Millisecond
	s := startServe(t, func(c *Config) { c.TeardownBudget = budget })
	ctx := context.Background()
	act, err := s.c.Activate(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	turn, err := s.c.Run(ctx, act.ID, []string{demoAgent}, "!escape\n!hang")
	if err != nil {
		t.Fatal(err)
	}
	defer turn.Close()
	agent := eventField[int](t, nextEvent(t, turn), "pid")
	escaped := eventField[int](t, nextEvent(t, turn), "pid")
	t.Cleanup(func() {
		_ = unix.Kill(escaped, unix.SIGKILL)
		_ = testbin.WaitGone(escaped, waitLimit)
	})
	if _, err := s.c.Interrupt(ctx, act.ID, 5*time.Second); err != nil {
		t.Fatalf("interrupt: %v", err)
	}
	s.rec.waitFor(t, RecordTeardownIncomplete, 1)
	got := s.rec.attrs(RecordTeardownIncomplete)[0]
	pids, _ := got["pids"].Any().([]int)
	if got["teardown"].String() != "cancel" || !slices.Equal(pids, []int{escaped}) ||
		got["agent_pid"].Int64() != int64(agent) || got["budget_ms"].Int64() != budget.Milliseconds() {
		t.Fatalf("record %v, want teardown cancel naming pid %d alone (agent %d)", got, escaped, agent)
	}
	if testbin.Alive(agent) || !testbin.Alive(escaped) {
		t.Fatalf("agent alive %v, escaped alive %v; want the agent gone, the escaped one named and running",
			testbin.Alive(agent), testbin.Alive(escaped))
	}
	// The same, left in its state directory for the daemon's metric,
	// collected once.
	state := filepath.Join(filepath.Dir(s.ws), "supervisor-state")
	recs, err := sandbox.CollectTeardownRecords(state)
	if err != nil || len(recs) != 1 || recs[0].Teardown != "cancel" || !slices.Equal(recs[0].PIDs, []int{escaped}) ||
		recs[0].AgentPID != agent || recs[0].BudgetMS != budget.Milliseconds() {
		t.Fatalf("records left for the daemon %+v (%v), want one cancel naming pid %d", recs, err, escaped)
	}
	if again, err := sandbox.CollectTeardownRecords(state); err != nil || len(again) != 0 {
		t.Fatalf("collected again: %+v (%v), want none", again, err)
	}
}
