package runner

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sys/unix"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/process"
)

// escapingTurn runs, in conv's real process sandbox, one turn whose agent
// leaves a process behind in a session of its own (out of the process
// group the supervisor kills), and returns that process's pid; it is
// killed when the test ends.
func escapingTurn(t *testing.T, b *process.Backend, conv string) int {
	t.Helper()
	ctx := context.Background()
	t.Cleanup(func() { _ = b.Remove(context.Background(), conv) })
	// The escaped process says its pid from its own session (setsid -f
	// forks first), so the agent ends only once it has left the group.
	agent := []string{"/bin/sh", "-c", `setsid -f sh -c 'echo "{\"type\":\"escaped\",\"pid\":$$}"; exec sleep 1000 >/dev/null 2>&1' </dev/null 2>/dev/null | head -n 1`}
	sb, err := b.Ensure(ctx, sandbox.Spec{ConversationID: conv, AgentCommand: agent})
	if err != nil {
		t.Fatal(err)
	}
	act, err := sb.Client().Activate(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := sb.Client().Run(ctx, act.ID, agent, "")
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	escaped := 0
	for {
		ev, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var e struct {
			Type string `json:"type"`
			PID  int    `json:"pid"`
		}
		if json.Unmarshal(ev.Data, &e) == nil && e.Type == "escaped" {
			escaped = e.PID
		}
	}
	if escaped == 0 || !alive(escaped) {
		t.Fatalf("the agent left no process behind (pid %d)", escaped)
	}
	t.Cleanup(func() { _ = unix.Kill(escaped, unix.SIGKILL) })
	return escaped
}

// S6 through the daemon, with the real process backend: an idle eviction
// and a deletion that cannot prove the sandbox's processes gone — a
// process a turn left in its own session survives the supervisor — each
// write one sandbox_teardown_incomplete record naming it (pid, teardown,
// budget) and count it in runnerd_sandbox_teardown_incomplete_total by
// reason; both are timed in runnerd_sandbox_teardown_seconds.
func TestS6TeardownIncompleteRecordedAndCounted(t *testing.T) {
	c := newCP(t)
	state := t.TempDir()
	const budget = 300 * time.Millisecond
	b, err := process.New(process.Config{StateDir: state, Command: []string{os.Args[0], "supervise"},
		Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "GORACE=atexit_sleep_ms=0"}, TeardownBudget: budget})
	if err != nil {
		t.Fatal(err)
	}
	d, logs := newTestDaemon(t, c, func(cfg *Config) {
		cfg.StateDir, cfg.Backend, cfg.SandboxIdle = state, b, time.Hour
	})
	evicted, deleted := escapingTurn(t, b, "conv-evicted"), escapingTurn(t, b, "conv-deleted")

	makeIdle(d, "conv-evicted", 2*time.Hour)
	d.idleRound(context.Background(), b)
	d.removeSandbox("conv-deleted")

	recs := logs.records(t, diagnostics.MsgSandboxTeardownIncomplete)
	if len(recs) != 2 {
		t.Fatalf("%s records %v, want two", diagnostics.MsgSandboxTeardownIncomplete, recs)
	}
	for i, want := range []struct {
		conv, teardown string
		pid            int
	}{{"conv-evicted", evictIdle, evicted}, {"conv-deleted", teardownDelete, deleted}} {
		r := recs[i]
		pids, _ := r[diagnostics.KeyPIDs].([]any)
		if r["conversation_id"] != want.conv || r[diagnostics.KeyTeardown] != want.teardown || len(pids) != 1 ||
			pids[0] != float64(want.pid) || r[diagnostics.KeyBudget] != float64(budget.Milliseconds()) {
			t.Errorf("record %v, want %s's %s teardown naming pid %d", r, want.conv, want.teardown, want.pid)
		}
		var m dto.Metric
		if err := d.m.SandboxTeardownIncomplete.WithLabelValues(want.teardown).Write(&m); err != nil || m.GetCounter().GetValue() != 1 {
			t.Errorf("runnerd_sandbox_teardown_incomplete_total{reason=%s} = %v, want 1", want.teardown, m.GetCounter().GetValue())
		}
		h, err := d.m.SandboxTeardown.GetMetricWithLabelValues(want.teardown)
		if err != nil {
			t.Fatal(err)
		}
		var hm dto.Metric
		if err := h.(interface{ Write(*dto.Metric) error }).Write(&hm); err != nil || hm.GetHistogram().GetSampleCount() != 1 {
			t.Errorf("runnerd_sandbox_teardown_seconds{teardown=%s} has %d samples, want 1", want.teardown, hm.GetHistogram().GetSampleCount())
		}
	}
	if ev := logs.records(t, diagnostics.MsgSandboxEvicted); len(ev) != 1 {
		t.Errorf("evicted records %v: the eviction stopped the supervisor all the same", ev)
	}
	if !alive(evicted) || !alive(deleted) {
		t.Errorf("a process named as surviving is gone")
	}
}

// S6: the teardowns a supervisor could not prove at a turn's cancel or
// fence — the records it leaves in its state directory beside its own
// log record (sandbox.WriteTeardownRecord, as supervisor's
// TestS6CancelNamesEscapedProcess proves it writes them) — reach the
// daemon's metric: one sweep round over the real process backend counts
// each in runnerd_sandbox_teardown_incomplete_total by its teardown,
// writes one sandbox_teardown_incomplete record (source supervisor)
// naming what survived, and removes the file, so the next round counts
// nothing again.
func TestS6SupervisorTeardownRecordsReachTheMetric(t *testing.T) {
	c := newCP(t)
	state := t.TempDir()
	b := newProcessBackend(t, state)
	d, logs := newTestDaemon(t, c, func(cfg *Config) { cfg.StateDir = state; cfg.Backend = b })
	conv := c.usableConversation()
	ensureSandbox(t, b, conv)
	for _, r := range []sandbox.TeardownRecord{
		{Teardown: "cancel", Generation: 2, AgentPID: 100, PIDs: []int{4242}, BudgetMS: 15000, At: time.Now()},
		{Teardown: "fence", Generation: 3, AgentPID: 101, PIDs: []int{4343, 4344}, BudgetMS: 15000, At: time.Now()},
	} {
		if err := sandbox.WriteTeardownRecord(b.StateDir(conv), r); err != nil {
			t.Fatal(err)
		}
	}
	s := sweeper{d: d, lister: b}
	for range 2 {
		s.round(context.Background())
	}
	recs := logs.records(t, diagnostics.MsgSandboxTeardownIncomplete)
	if len(recs) != 2 {
		t.Fatalf("%s records %v, want two", diagnostics.MsgSandboxTeardownIncomplete, recs)
	}
	for i, want := range []struct {
		teardown string
		pids     int
	}{{"cancel", 1}, {"fence", 2}} {
		r := recs[i]
		pids, _ := r[diagnostics.KeyPIDs].([]any)
		if r["conversation_id"] != conv || r[diagnostics.KeyTeardown] != want.teardown || r["source"] != sourceSupervisor || len(pids) != want.pids {
			t.Errorf("record %v, want the supervisor's %s teardown of %s naming %d pids", r, want.teardown, conv, want.pids)
		}
		var m dto.Metric
		if err := d.m.SandboxTeardownIncomplete.WithLabelValues(want.teardown).Write(&m); err != nil || m.GetCounter().GetValue() != 1 {
			t.Errorf("runnerd_sandbox_teardown_incomplete_total{reason=%s} = %v, want 1", want.teardown, m.GetCounter().GetValue())
		}
	}
	if left, err := os.ReadDir(filepath.Join(b.StateDir(conv), sandbox.TeardownRecordsDir)); err != nil || len(left) != 0 {
		t.Errorf("records left in the supervisor's state: %v (%v), want none", left, err)
	}
}
