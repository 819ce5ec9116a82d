package runner

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/process"
)

// records lists the records named msg, as decoded JSON objects.
func (l *logBuf) records(t *testing.T, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.String()), "\n") {
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("record %q: %v", line, err)
		}
		if r["msg"] == msg {
			out = append(out, r)
		}
	}
	return out
}

// makeIdle sets conv's idle clock as if its last turn ended ago.
func makeIdle(d *Daemon, conv string, ago time.Duration) {
	d.mu.Lock()
	d.idle[conv] = &sandboxIdle{phase: sandboxRetained, since: time.Now().Add(-ago)}
	d.mu.Unlock()
}

// S1 with the real process backend: a round stops the supervisor of a
// conversation idle for --sandbox-idle (one sandbox_evicted record, its
// sandbox kept), leaves alone one idle for less, one whose turn is held
// here and one first listed this round (its clock starts now), and records
// nothing for a sandbox already stopped. A turn held afterwards records
// the wake, and its Ensure starts the same sandbox again.
func TestS1IdleRoundEvictsOnlyTheIdle(t *testing.T) {
	c := newCP(t)
	state := t.TempDir()
	b := newProcessBackend(t, state)
	d, logs := newTestDaemon(t, c, func(cfg *Config) {
		cfg.StateDir, cfg.Backend, cfg.SandboxIdle = state, b, time.Hour
	})
	idle, recent, held, fresh := "conv-idle", "conv-recent", "conv-held", "conv-fresh"
	pids := map[string]int{}
	for _, conv := range []string{idle, recent, held, fresh} {
		pids[conv] = ensureSandbox(t, b, conv)
	}
	makeIdle(d, idle, 2*time.Hour)
	makeIdle(d, recent, 30*time.Minute)
	makeIdle(d, held, 2*time.Hour)
	d.holdConversation(held) // a turn of it is claimed: its clock goes

	d.idleRound(context.Background(), b)

	if alive(pids[idle]) {
		t.Errorf("the idle conversation's supervisor (pid %d) still runs", pids[idle])
	}
	for _, conv := range []string{recent, held, fresh} {
		if !alive(pids[conv]) {
			t.Errorf("the supervisor of %s (pid %d) was stopped", conv, pids[conv])
		}
	}
	ev := logs.records(t, diagnostics.MsgSandboxEvicted)
	if len(ev) != 1 || ev[0]["conversation_id"] != idle || ev[0]["backend"] != sandbox.BackendProcess ||
		ev[0][diagnostics.KeyIdle].(float64) < float64(2*time.Hour/time.Millisecond) {
		t.Fatalf("evicted records %v, want one for %s idle ≥ 2 h", ev, idle)
	}
	var evicted dto.Metric
	if err := d.m.SandboxEvictions.WithLabelValues("evicted").Write(&evicted); err != nil || evicted.GetCounter().GetValue() != 1 {
		n := evicted.GetCounter().GetValue()
		t.Errorf("runnerd_sandbox_evictions_total{result=evicted} = %v, want 1", n)
	}
	if convs, _ := b.Conversations(context.Background()); len(convs) != 4 {
		t.Fatalf("sandboxes after the eviction %v: none may be deleted", convs)
	}

	// Rounds go on: the stopped one is not stopped (or recorded) again,
	// the held one is not touched while held however old its last turn.
	makeIdle(d, fresh, 2*time.Hour)
	d.idleRound(context.Background(), b)
	if alive(pids[fresh]) {
		t.Errorf("%s idle for 2 h still runs", fresh)
	}
	if !alive(pids[held]) {
		t.Errorf("the held conversation's supervisor was stopped")
	}
	if n := len(logs.records(t, diagnostics.MsgSandboxEvicted)); n != 2 {
		t.Errorf("%d evicted records, want 2", n)
	}

	// The next turn of the evicted conversation: held, recorded as a wake,
	// and its Ensure starts the same sandbox again.
	d.holdConversation(idle)
	if w := logs.records(t, diagnostics.MsgSandboxWoken); len(w) != 1 || w[0]["conversation_id"] != idle {
		t.Fatalf("woken records %v, want one for %s", w, idle)
	}
	sb, err := b.Ensure(context.Background(), sandbox.Spec{ConversationID: idle, AgentCommand: []string{"true"}})
	if err != nil || !sb.Created {
		t.Fatalf("ensure after the eviction: %+v, %v; want the sandbox started again", sb, err)
	}
	d.releaseConversation(idle)
	d.releaseConversation(held)
	logs.noSecrets(t, c.hostToken)
}

// raceStopper hands Stop's idle question to the real backend, and runs
// during() right after idle answered yes, still under the conversation's
// lock: what a claim that comes between idle's answer and the stop does.
type raceStopper struct {
	*process.Backend
	during func()
}

func (r raceStopper) Stop(ctx context.Context, conv string, idle func() bool) (bool, error) {
	return r.Backend.Stop(ctx, conv, func() bool {
		ok := idle()
		if ok {
			r.during()
		}
		return ok
	})
}

// S1, no race between a claim and an eviction: a claim held after the
// eviction's idle answer makes its turn's Ensure wait for the stop and
// then start the sandbox again — same sandbox id, a live new supervisor
// answering for the turn — never a supervisor stopped under a turn that
// found it running. A claim held before the answer prevents the stop.
func TestS1ClaimDuringEvictionWakesTheSandbox(t *testing.T) {
	c := newCP(t)
	state := t.TempDir()
	b := newProcessBackend(t, state)
	d, logs := newTestDaemon(t, c, func(cfg *Config) {
		cfg.StateDir, cfg.Backend, cfg.SandboxIdle = state, b, time.Hour
	})
	const conv = "conv-raced"
	old := ensureSandbox(t, b, conv)
	spec := sandbox.Spec{ConversationID: conv, AgentCommand: []string{"true"}}
	first, err := b.Ensure(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}

	type ensured struct {
		sb  sandbox.Sandbox
		err error
	}
	got := make(chan ensured, 1)
	st := raceStopper{Backend: b, during: func() {
		d.holdConversation(conv) // the claim
		go func() {              // its turn child: Ensure, then the turn
			sb, err := newProcessBackend(t, state).Ensure(context.Background(), spec)
			got <- ensured{sb, err}
		}()
	}}
	makeIdle(d, conv, 2*time.Hour)
	d.idleRound(context.Background(), st)
	if alive(old) {
		t.Fatalf("the evicted supervisor (pid %d) still runs", old)
	}
	e := <-got
	if e.err != nil || e.sb.ID != first.ID || !e.sb.Created {
		t.Fatalf("the claimed turn's Ensure: %+v, %v; want sandbox %s started again", e.sb, e.err, first.ID)
	}
	now, err := e.sb.Client().Status(context.Background())
	if err != nil || now.PID == old || !alive(now.PID) {
		t.Fatalf("the turn's supervisor: %+v, %v (evicted pid %d)", now, err, old)
	}
	if n := len(logs.records(t, diagnostics.MsgSandboxWoken)); n != 1 {
		t.Errorf("%d woken records, want 1", n)
	}

	// Held before the question: idle says no, nothing is stopped, even
	// with a clock that says idle (a stale entry).
	makeIdle(d, conv, 2*time.Hour)
	d.mu.Lock()
	d.turnConvs[conv]++ // held already, the clock left as it was
	d.mu.Unlock()
	d.evict(context.Background(), b, conv, d.cfg.SandboxIdle, evictIdle)
	if !alive(now.PID) {
		t.Fatalf("a held conversation's supervisor (pid %d) was stopped", now.PID)
	}
	if n := len(logs.records(t, diagnostics.MsgSandboxEvicted)); n != 1 {
		t.Errorf("%d evicted records, want only the first", n)
	}
}
