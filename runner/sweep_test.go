package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/docker"
	"github.com/runnerd/runnerd/sandbox/process"
	"github.com/runnerd/runnerd/wire"
)

// Both real backends can be swept: Run finds the lister by assertion.
var (
	_ sandboxLister = (*process.Backend)(nil)
	_ sandboxLister = (*docker.Backend)(nil)
)

// lostConversation runs a turn of a new conversation into LOST on the real
// control plane: claimed, admitted, and its admission's answer taken for
// lost (R30). An admitted turn that merely failed unsettled would leave it
// quarantined (K13), which a host never removes.
func (c *cp) lostConversation() string {
	c.t.Helper()
	j := c.enqueue("lost")
	cl := c.claim(testTimings.LeaseTTL)
	if cl.JobID != j.ID {
		c.t.Fatalf("claimed %s, want %s", cl.JobID, j.ID)
	}
	ctx := context.Background()
	ref := wire.AttemptRef{AttemptID: cl.AttemptID, LeaseGeneration: cl.LeaseGeneration}
	if _, err := c.wc.Admission(ctx, cl.WorkerToken, cl.JobID, wire.AdmissionRequest{AttemptRef: ref, ActivationID: "act-1"}); err != nil {
		c.t.Fatal(err)
	}
	resp, err := c.wc.Finish(ctx, cl.WorkerToken, cl.JobID, wire.FinishRequest{AttemptRef: ref, Outcome: wire.OutcomeFailed, Class: "workspace_missing", Unrecoverable: true})
	if err != nil || resp.ConversationState != wire.ConversationLost {
		c.t.Fatalf("finish: %+v, %v; want the conversation lost", resp, err)
	}
	return j.ConversationID
}

// usableConversation creates a conversation with no turn.
func (c *cp) usableConversation() string {
	c.t.Helper()
	conv, err := c.st.CreateConversation(context.Background(), wire.CreateConversationRequest{Image: "scratch", AgentCommand: []string{"demoagent"}}, c.now())
	if err != nil {
		c.t.Fatal(err)
	}
	return conv.ID
}

// newProcessBackend is the real process backend over stateDir, whose
// supervisors are this test binary re-entered as "supervise".
func newProcessBackend(t *testing.T, stateDir string) *process.Backend {
	t.Helper()
	b, err := process.New(process.Config{
		StateDir:    stateDir,
		Command:     []string{os.Args[0], "supervise"},
		Env:         []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "GORACE=atexit_sleep_ms=0"},
		StopTimeout: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// ensureSandbox starts conv's real supervisor and returns its pid; the
// test's end removes whatever is left.
func ensureSandbox(t *testing.T, b *process.Backend, conv string) int {
	t.Helper()
	ctx := context.Background()
	t.Cleanup(func() { _ = b.Remove(context.Background(), conv) })
	sb, err := b.Ensure(ctx, sandbox.Spec{ConversationID: conv, AgentCommand: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	st, err := sb.Client().Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st.PID
}

// alive reports whether pid is a process that has not exited (a zombie
// has).
func alive(pid int) bool {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(raw), ") ")
	return !strings.HasPrefix(rest, "Z")
}

// swept lists the (conversation, state, backend) of the sweep's records.
func (l *logBuf) swept(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(l.String()), "\n") {
		var r struct {
			Msg               string `json:"msg"`
			ConversationID    string `json:"conversation_id"`
			ConversationState string `json:"conversation_state"`
			Backend           string `json:"backend"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("record %q: %v", line, err)
		}
		if r.Msg == MsgSandboxSwept {
			out = append(out, r.ConversationID+" "+r.ConversationState+" "+r.Backend)
		}
	}
	slices.Sort(out)
	return out
}

// Issues 6 and 7, K8: one sweep round against the real control plane and
// the real process backend stops the supervisor and deletes the sandbox of
// a LOST conversation, one record; it keeps the sandbox of one the control
// plane does not know (no tombstone is no evidence) and a usable
// conversation's supervisor running (the same process, found again), and
// it never touches a conversation with a turn held on this host, LOST or
// not.
func TestSandboxSweepRemovesLostKeepsUnknown(t *testing.T) {
	c := newCP(t)
	state := t.TempDir()
	b := newProcessBackend(t, state)
	d, logs := newTestDaemon(t, c, func(cfg *Config) { cfg.StateDir = state; cfg.Backend = b })

	lost, usable, busy := c.lostConversation(), c.usableConversation(), c.lostConversation()
	const unknown = "conv_deleted-long-ago"
	pids := map[string]int{}
	for _, conv := range []string{lost, usable, busy, unknown} {
		pids[conv] = ensureSandbox(t, b, conv)
	}
	d.holdConversation(busy) // a turn of it is held here

	s := sweeper{d: d, lister: b}
	s.round(context.Background())

	for _, conv := range []string{lost} {
		if alive(pids[conv]) {
			t.Errorf("the supervisor of %s (pid %d) still runs", conv, pids[conv])
		}
		if _, err := os.Stat(b.Dir(conv)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the sandbox of %s is still there: %v", conv, err)
		}
	}
	for _, conv := range []string{usable, busy, unknown} {
		if !alive(pids[conv]) {
			t.Errorf("the supervisor of %s (pid %d) was stopped", conv, pids[conv])
		}
	}
	if got, err := b.Conversations(context.Background()); err != nil || !slices.Equal(got, sortedOf(usable, busy, unknown)) {
		t.Errorf("sandboxes left %v (%v), want %s, %s and %s", got, err, usable, busy, unknown)
	}
	want := []string{lost + " lost process"}
	if got := logs.swept(t); !slices.Equal(got, want) {
		t.Errorf("swept records %v, want %v\n%s", got, want, logs)
	}

	// Once its turn is over, the next round removes the LOST one too, and
	// the usable one is still left alone, with the same supervisor.
	d.releaseConversation(busy)
	s.round(context.Background())
	if alive(pids[busy]) {
		t.Errorf("the supervisor of %s still runs after its turn ended", busy)
	}
	if got, _ := b.Conversations(context.Background()); !slices.Equal(got, sortedOf(usable, unknown)) {
		t.Errorf("sandboxes left %v, want only %s and %s", got, usable, unknown)
	}
	if !alive(pids[usable]) || !alive(pids[unknown]) {
		t.Error("the usable or the unknown conversation's supervisor was stopped")
	}
	if n := logs.count(MsgSandboxSwept); n != 2 {
		t.Errorf("%d swept records, want 2", n)
	}
	logs.noSecrets(t, c.hostToken)
}

// S3, K8: a conversation its owner deleted through the real control
// plane's DELETE is a positive answer: one sweep round against the real
// process backend stops its supervisor and removes its sandbox (supervisor
// state and workspace), one record with state and reason deleted; a usable
// conversation beside it keeps its supervisor.
func TestSandboxSweepRemovesDeleted(t *testing.T) {
	c := newCP(t)
	state := t.TempDir()
	b := newProcessBackend(t, state)
	d, logs := newTestDaemon(t, c, func(cfg *Config) { cfg.StateDir = state; cfg.Backend = b })

	deleted, usable := c.usableConversation(), c.usableConversation()
	pids := map[string]int{deleted: ensureSandbox(t, b, deleted), usable: ensureSandbox(t, b, usable)}
	s := sweeper{d: d, lister: b}
	s.round(context.Background()) // both usable: nothing goes
	if got, _ := b.Conversations(context.Background()); !slices.Equal(got, sortedOf(deleted, usable)) {
		t.Fatalf("sandboxes before the delete %v", got)
	}

	req, err := http.NewRequest(http.MethodDelete, c.url+"/v1/conversations/"+deleted, nil)
	if err != nil {
		t.Fatal(err)
	}
	const userToken = "rdu_sweep-test-user-token"
	if _, err := c.st.CreateUserToken(context.Background(), "test", controlplane.HashToken(userToken), store.Audit{Actor: "test"}, c.now()); err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+userToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("DELETE answered %d", resp.StatusCode)
	}
	s.round(context.Background())

	if alive(pids[deleted]) {
		t.Errorf("the supervisor of deleted %s (pid %d) still runs", deleted, pids[deleted])
	}
	if _, err := os.Stat(b.Dir(deleted)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the sandbox of deleted %s is still there: %v", deleted, err)
	}
	if !alive(pids[usable]) {
		t.Errorf("the usable conversation's supervisor was stopped")
	}
	if got := logs.swept(t); !slices.Equal(got, []string{deleted + " deleted process"}) {
		t.Errorf("swept records %v\n%s", got, logs)
	}
	if got := logs.sweptWhy(t); !slices.Equal(got, []string{deleted + " " + sweptDeleted}) {
		t.Errorf("swept reasons %v", got)
	}
}

func sortedOf(s ...string) []string {
	slices.Sort(s)
	return s
}

// gate stands between the daemon and the real control plane: while down,
// it answers every request 503; with noRoute it answers the sweep's call
// 404, as a control plane without it would.
type gate struct {
	down, noRoute atomic.Bool
	next          http.Handler
}

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case g.down.Load():
		http.Error(w, `{"code":"internal"}`, http.StatusServiceUnavailable)
	case g.noRoute.Load() && r.URL.Path == wire.PathConversations:
		http.Error(w, `{"code":"not_found"}`, http.StatusNotFound)
	default:
		g.next.ServeHTTP(w, r)
	}
}

// An outage of the control plane removes nothing — no sandbox is removed
// on a guess — and leaves one agent_control_failure record however many
// rounds it lasts; when it answers again, one recovery record and the LOST
// conversation's sandbox goes. A control plane without the call (404)
// removes nothing, with one record however many rounds; once it has the
// call (an upgrade), the sweep works again without a restart.
func TestSandboxSweepOutage(t *testing.T) {
	c := newCP(t)
	g := &gate{next: c.srv.Handler()}
	hs := httptest.NewServer(g)
	t.Cleanup(hs.Close)
	state := t.TempDir()
	b := newProcessBackend(t, state)
	d, logs := newTestDaemon(t, c, func(cfg *Config) {
		cfg.StateDir = state
		cfg.Backend = b
		cfg.ControlPlaneURL = hs.URL
	})
	lost := c.lostConversation()
	pid := ensureSandbox(t, b, lost)
	s := sweeper{d: d, lister: b}

	g.down.Store(true)
	for range 3 {
		s.round(context.Background())
	}
	if !alive(pid) {
		t.Fatal("a sandbox was removed while the control plane did not answer")
	}
	if n := logs.count("agent_control_failure"); n != 1 || !strings.Contains(logs.String(), `"op":"`+opSweep+`"`) {
		t.Fatalf("%d control failure records for one outage, want 1 naming %s\n%s", n, opSweep, logs)
	}

	g.down.Store(false)
	s.round(context.Background())
	if alive(pid) {
		t.Fatal("the LOST conversation's supervisor still runs after the outage")
	}
	if n := logs.count(MsgControlRecovered); n != 1 {
		t.Fatalf("%d recovery records, want 1", n)
	}

	// A control plane without the call.
	lost2 := c.lostConversation()
	pid2 := ensureSandbox(t, b, lost2)
	g.noRoute.Store(true)
	for range 2 {
		s.round(context.Background())
	}
	if !alive(pid2) || !s.unsupported {
		t.Fatalf("404: supervisor alive %v, sweep off %v", alive(pid2), s.unsupported)
	}
	if n := logs.count(MsgSweepOff); n != 1 {
		t.Fatalf("%d %s records, want 1", n, MsgSweepOff)
	}
	if n := logs.count("agent_control_failure"); n != 1 {
		t.Fatalf("a 404 was recorded as an outage: %d control failure records", n)
	}
	g.noRoute.Store(false)
	s.round(context.Background())
	if alive(pid2) || s.unsupported {
		t.Fatalf("after the upgrade: supervisor alive %v, sweep off %v", alive(pid2), s.unsupported)
	}
	if n := logs.count(MsgControlRecovered); n != 2 {
		t.Fatalf("%d recovery records, want 2 (outage, then upgrade)", n)
	}
	logs.noSecrets(t, c.hostToken)
}

// The loop: Run sweeps once at start, after the restart decisions, then
// every SandboxSweep, and its sweep goroutine ends with Run (TestMain's
// goleak). No report of this daemon ever said these conversations were
// LOST — as when the reaper decides after the daemon stopped a turn on
// lease loss — and a sandbox that appears while it runs goes at a later
// round.
func TestSandboxSweepLoop(t *testing.T) {
	c := newCP(t)
	state := t.TempDir()
	b := newProcessBackend(t, state)
	d, logs := newTestDaemon(t, c, func(cfg *Config) {
		cfg.StateDir = state
		cfg.Backend = b
		cfg.SandboxSweep = 100 * time.Millisecond
	})
	// Both LOST before the start (a running daemon would claim the turn
	// that makes one LOST); the second's sandbox appears only later.
	atStart, later := c.lostConversation(), c.lostConversation()
	startPid := ensureSandbox(t, b, atStart)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()

	waitFor(t, "the sandbox present at the start to go", 20*time.Second, func() bool { return !alive(startPid) })
	// The sweep may remove it at once, so only Ensure's success says it
	// was there.
	t.Cleanup(func() { _ = b.Remove(context.Background(), later) })
	if _, err := b.Ensure(ctx, sandbox.Spec{ConversationID: later, AgentCommand: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the sandbox that appeared later to go", 20*time.Second, func() bool {
		_, err := os.Stat(b.Dir(later))
		return errors.Is(err, fs.ErrNotExist)
	})

	d.Drain()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after the drain")
	}
	want := sortedOf(atStart+" lost process", later+" lost process")
	if got := logs.swept(t); !slices.Equal(got, want) {
		t.Fatalf("swept records %v, want %v", got, want)
	}
	if !strings.Contains(logs.String(), `"sandbox_sweep_ms":100`) {
		t.Error("the start record does not carry the sweep period")
	}
}

// SandboxSweep: zero is the default minute, negative turns the sweep off.
func TestSandboxSweepConfig(t *testing.T) {
	for _, tc := range []struct {
		in, want time.Duration
	}{{0, DefaultSandboxSweep}, {-1, -1}, {time.Second, time.Second}} {
		cfg := Config{ControlPlaneURL: "http://cp", HostToken: "t", HostName: "h", StateDir: "/s", Executable: "/x", SandboxSweep: tc.in}
		got, err := cfg.withDefaults()
		if err != nil || got.SandboxSweep != tc.want {
			t.Errorf("SandboxSweep %v: got %v (%v), want %v", tc.in, got.SandboxSweep, err, tc.want)
		}
	}
}

// The sweep's decision for each answer of the pinned cluster: only
// positive evidence removes (K8) — LOST, deleted (S3), or the sandbox
// recorded on another host — and a turn held here keeps it whatever the
// answer.
func TestSweepReason(t *testing.T) {
	for _, tc := range []struct {
		name     string
		st       wire.ConversationState
		turnHere bool
		want     string
	}{
		{"lost", wire.ConversationState{State: wire.ConversationLost}, false, sweptLost},
		{"lost, recorded elsewhere", wire.ConversationState{State: wire.ConversationLost, Sandbox: wire.SandboxOtherHost}, false, sweptLost},
		{"unknown", wire.ConversationState{State: wire.ConversationUnknown}, false, ""},
		{"unknown, recorded elsewhere", wire.ConversationState{State: wire.ConversationUnknown, Sandbox: wire.SandboxOtherHost}, false, ""},
		{"recorded elsewhere", wire.ConversationState{State: wire.ConversationUsable, Sandbox: wire.SandboxOtherHost, SandboxHost: "host-b"}, false, sweptRecordedElsewhere},
		{"quarantined, recorded elsewhere", wire.ConversationState{State: wire.ConversationQuarantined, Sandbox: wire.SandboxOtherHost}, false, sweptRecordedElsewhere},
		{"recorded here", wire.ConversationState{State: wire.ConversationUsable, Sandbox: wire.SandboxThisHost}, false, ""},
		{"quarantined, recorded here", wire.ConversationState{State: wire.ConversationQuarantined, Sandbox: wire.SandboxThisHost}, false, ""},
		{"nothing recorded", wire.ConversationState{State: wire.ConversationUsable}, false, ""},
		{"a sandbox value this host does not know", wire.ConversationState{State: wire.ConversationUsable, Sandbox: "somewhere"}, false, ""},
		{"running turn, recorded elsewhere", wire.ConversationState{State: wire.ConversationUsable, Sandbox: wire.SandboxOtherHost}, true, ""},
		{"running turn, lost", wire.ConversationState{State: wire.ConversationLost}, true, ""},
		{"deleted", wire.ConversationState{State: wire.ConversationDeleted, Sandbox: wire.SandboxThisHost}, false, sweptDeleted},
		{"deleted, nothing recorded", wire.ConversationState{State: wire.ConversationDeleted}, false, sweptDeleted},
		{"running turn, deleted", wire.ConversationState{State: wire.ConversationDeleted}, true, ""},
	} {
		if got := sweepReason(tc.st, tc.turnHere); got != tc.want {
			t.Errorf("%s: sweepReason(%+v, turn here %v) = %q, want %q", tc.name, tc.st, tc.turnHere, got, tc.want)
		}
	}
}

// sweptWhy lists the (conversation, reason, sandbox host) of the sweep's
// records.
func (l *logBuf) sweptWhy(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(l.String()), "\n") {
		var r struct {
			Msg            string `json:"msg"`
			ConversationID string `json:"conversation_id"`
			Reason         string `json:"reason"`
			SandboxHost    string `json:"sandbox_host"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("record %q: %v", line, err)
		}
		if r.Msg == MsgSandboxSwept {
			out = append(out, strings.TrimSpace(r.ConversationID+" "+r.Reason+" "+r.SandboxHost))
		}
	}
	slices.Sort(out)
	return out
}

// The foreign sandbox, two hosts on the real control plane, the real
// process backend on host-a: host-a's attempt ensures the conversation's
// sandbox and is released before it records it. While nothing is
// recorded, host-a's sweep keeps it (host-b may be about to record, or
// host-a's next attempt); once host-b's attempt records its own, the next
// round stops host-a's supervisor and deletes its sandbox, one record with
// reason recorded_elsewhere, and host-a is given no turn of it again. A
// sandbox recorded on host-a is kept.
func TestSandboxSweepRemovesRecordedElsewhere(t *testing.T) {
	c := newCP(t)
	state := t.TempDir()
	b := newProcessBackend(t, state)
	d, logs := newTestDaemon(t, c, func(cfg *Config) { cfg.StateDir = state; cfg.Backend = b })
	ctx := context.Background()
	tokenB := controlplane.NewToken(controlplane.HostTokenPrefix)
	if _, err := c.st.CreateHost(ctx, "host-b", controlplane.HashToken(tokenB), store.Audit{Actor: "test"}, c.now()); err != nil {
		t.Fatal(err)
	}
	ref := func(cl wire.Claim) wire.AttemptRef {
		return wire.AttemptRef{AttemptID: cl.AttemptID, LeaseGeneration: cl.LeaseGeneration}
	}
	record := func(cl wire.Claim, id string) {
		t.Helper()
		if err := c.wc.Container(ctx, cl.WorkerToken, cl.JobID, wire.ContainerRequest{AttemptRef: ref(cl), Backend: "process", ContainerID: id}); err != nil {
			t.Fatal(err)
		}
	}

	// Recorded here: host-a's own turn.
	home := c.enqueue("home")
	clHome := c.claim(testTimings.LeaseTTL)
	pidHome := ensureSandbox(t, b, home.ConversationID)
	record(clHome, "ws-home")

	// The foreign one: host-a ensures, then releases before recording.
	// (Claimed while home's turn runs, so it is the only turn to take.)
	j := c.enqueue("foreign")
	clA := c.claim(testTimings.LeaseTTL)
	if clA.JobID != j.ID {
		t.Fatalf("host-a claimed %s, want %s", clA.JobID, j.ID)
	}
	pid := ensureSandbox(t, b, j.ConversationID)
	for _, cl := range []wire.Claim{clA, clHome} {
		if err := c.wc.Release(ctx, cl.WorkerToken, cl.JobID, wire.ReleaseRequest{AttemptRef: ref(cl), Class: "spawn_failed"}); err != nil {
			t.Fatal(err)
		}
	}
	s := sweeper{d: d, lister: b}
	s.round(ctx)
	if !alive(pid) || !alive(pidHome) || logs.count(MsgSandboxSwept) != 0 {
		t.Fatalf("nothing recorded elsewhere yet, but the sweep removed a sandbox\n%s", logs)
	}

	// host-b takes the turn after the release backoff and records its own.
	c.advance(time.Second)
	clB, err := c.wc.Claim(ctx, tokenB, wire.ClaimRequest{LeaseTTLMS: testTimings.LeaseTTL.Milliseconds()})
	if err != nil || clB.JobID != j.ID {
		t.Fatalf("host-b claimed %+v, %v; want %s", clB, err, j.ID)
	}
	record(clB, "ws-b")
	s.round(ctx)
	if alive(pid) {
		t.Errorf("host-a's supervisor of %s (pid %d) still runs", j.ConversationID, pid)
	}
	if _, err := os.Stat(b.Dir(j.ConversationID)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("host-a's sandbox of %s is still there: %v", j.ConversationID, err)
	}
	if !alive(pidHome) {
		t.Errorf("the sandbox recorded on host-a was stopped")
	}
	if got, want := logs.sweptWhy(t), []string{j.ConversationID + " " + sweptRecordedElsewhere + " host-b"}; !slices.Equal(got, want) {
		t.Errorf("swept records %v, want %v\n%s", got, want, logs)
	}

	// Affinity: its turns go to host-b only; host-a is given its own.
	if err := c.wc.Release(ctx, clB.WorkerToken, clB.JobID, wire.ReleaseRequest{AttemptRef: ref(clB), Class: "spawn_failed"}); err != nil {
		t.Fatal(err)
	}
	c.advance(time.Second)
	if cl := c.claim(testTimings.LeaseTTL); cl.JobID != home.ID {
		t.Errorf("host-a claimed %q, want only its own %s; the foreign conversation: %+v; job %+v", cl.JobID, home.ID, c.conversation(j.ConversationID), c.job(cl.JobID))
	}
	if cl, err := c.wc.Claim(ctx, c.hostToken, wire.ClaimRequest{LeaseTTLMS: testTimings.LeaseTTL.Milliseconds()}); !errors.Is(err, wire.ErrNoClaim) {
		t.Errorf("host-a claimed %+v, %v; want nothing (the foreign turn waits for host-b)", cl, err)
	}
	logs.noSecrets(t, c.hostToken, tokenB)
}
