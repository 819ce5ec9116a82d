package process

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/internal/testbin"
	"github.com/runnerd/runnerd/sandbox/supervisor"
	"github.com/runnerd/runnerd/wire"
)

var demoAgent string

// TestMain re-enters the test binary as "supervise" (standing in for
// runnerd supervise) and as "ensure STATE CONV" (a short-lived turn child
// that starts a supervisor and exits).
func TestMain(m *testing.M) {
	testbin.Main(m, &demoAgent, map[string]func([]string) int{
		"supervise": func(args []string) int {
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			return supervisor.Main(ctx, args, os.Stderr)
		},
		"ensure": func(args []string) int { return ensureMain(args[0], args[1]) },
	})
}

func ensureMain(state, conv string) int {
	b, err := New(Config{StateDir: state, Command: []string{os.Args[0], "supervise"}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	sb, err := b.Ensure(context.Background(), sandbox.Spec{ConversationID: conv, AgentCommand: []string{demoAgent}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_ = json.NewEncoder(os.Stdout).Encode(sb)
	return 0
}

const waitLimit = 20 * time.Second

// testEnv is the supervisors' environment: the default one, and no
// race-detector pause at exit.
var testEnv = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "GORACE=atexit_sleep_ms=0"}

func newBackend(t *testing.T, state string) *Backend {
	t.Helper()
	b, err := New(Config{StateDir: state, Command: []string{os.Args[0], "supervise"}, Env: testEnv})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// cleanup removes a conversation's sandbox at the end of the test, so no
// supervisor outlives it.
func cleanup(t *testing.T, b *Backend, conv string) {
	t.Cleanup(func() {
		if err := b.Remove(context.Background(), conv); err != nil {
			t.Errorf("remove: %v", err)
		}
	})
}

func spec(conv string) sandbox.Spec {
	return sandbox.Spec{ConversationID: conv, AgentCommand: []string{demoAgent}}
}

// turn runs one prompt to its end and settles it.
func turn(t *testing.T, c *sandbox.Client, prompt string) (sandbox.Activation, int64) {
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
	defer tr.Close()
	for {
		if _, err := tr.Next(); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			break
		}
	}
	rc, err := c.Settle(ctx, act.ID)
	if err != nil {
		t.Fatal(err)
	}
	return act, rc.NativeTurn
}

// A fresh Backend value — a restarted daemon — finds the same running
// supervisor, with its receipt and its native session.
func TestEnsureFindsSameSupervisorFromFreshBackend(t *testing.T) {
	state := t.TempDir()
	ctx := context.Background()
	b1 := newBackend(t, state)
	cleanup(t, b1, "conv-1")
	sb1, err := b1.Ensure(ctx, spec("conv-1"))
	if err != nil {
		t.Fatal(err)
	}
	if !sb1.Created || sb1.Backend != sandbox.BackendProcess || !strings.HasPrefix(sb1.ID, "proc-") {
		t.Fatalf("first ensure %+v", sb1)
	}
	st1, err := sb1.Client().Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	act, nt := turn(t, sb1.Client(), "first")

	b2 := newBackend(t, state)
	sb2, err := b2.Ensure(ctx, spec("conv-1"))
	if err != nil {
		t.Fatal(err)
	}
	if sb2.Created || sb2.ID != sb1.ID || sb2.Socket != sb1.Socket {
		t.Fatalf("second ensure %+v, first %+v", sb2, sb1)
	}
	st2, err := sb2.Client().Status(ctx)
	if err != nil || st2.PID != st1.PID {
		t.Fatalf("status after the fresh ensure %+v (%v), before %+v", st2, err, st1)
	}
	// Same supervisor: the receipt is still there (R26).
	if rc, err := sb2.Client().Settle(ctx, act.ID); err != nil || rc.NativeTurn != nt {
		t.Fatalf("settle through the fresh backend: %+v, %v", rc, err)
	}
	if _, nt2 := turn(t, sb2.Client(), "second"); nt2 != nt+1 {
		t.Fatalf("native turn %d after %d", nt2, nt)
	}
}

// A supervisor that died is started again over the same workspace: same
// identity, native session continued, receipts gone (R28).
func TestEnsureRestartsDeadSupervisor(t *testing.T) {
	state := t.TempDir()
	ctx := context.Background()
	b := newBackend(t, state)
	cleanup(t, b, "conv-2")
	sb, err := b.Ensure(ctx, spec("conv-2"))
	if err != nil {
		t.Fatal(err)
	}
	act, nt := turn(t, sb.Client(), "before the crash")
	st, err := sb.Client().Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := testbin.WaitGone(st.PID, waitLimit); err != nil {
		t.Fatal(err)
	}

	sb2, err := newBackend(t, state).Ensure(ctx, spec("conv-2"))
	if err != nil {
		t.Fatal(err)
	}
	if !sb2.Created || sb2.ID != sb.ID {
		t.Fatalf("ensure after the crash %+v, before %+v", sb2, sb)
	}
	st2, err := sb2.Client().Status(ctx)
	if err != nil || st2.PID == st.PID || st2.NativeTurn != nt {
		t.Fatalf("status after restart %+v (%v), before %+v", st2, err, st)
	}
	if _, err := sb2.Client().Settle(ctx, act.ID); !errors.Is(err, sandbox.ErrUnknownActivation) {
		t.Fatalf("settle after the restart: %v, want ErrUnknownActivation", err)
	}
	if _, nt2 := turn(t, sb2.Client(), "after the crash"); nt2 != nt+1 {
		t.Fatalf("native turn %d after %d", nt2, nt)
	}
}

// The supervisor runs in its own session: the process that started it (a
// turn child) being killed with its whole process group leaves it running.
func TestSupervisorOutlivesItsStarter(t *testing.T) {
	state := t.TempDir()
	ctx := context.Background()
	cleanup(t, newBackend(t, state), "conv-3")
	starter := exec.Command(os.Args[0], "ensure", state, "conv-3")
	starter.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := starter.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := starter.Start(); err != nil {
		t.Fatal(err)
	}
	var sb sandbox.Sandbox
	if err := json.NewDecoder(out).Decode(&sb); err != nil {
		t.Fatalf("starter said nothing: %v", err)
	}
	_ = syscall.Kill(-starter.Process.Pid, syscall.SIGKILL)
	_ = starter.Wait()
	st, err := sb.Client().Status(ctx)
	if err != nil {
		t.Fatalf("supervisor died with its starter: %v", err)
	}
	sid, err := unix.Getsid(st.PID)
	if err != nil || sid != st.PID {
		t.Fatalf("supervisor %d is in session %d (%v), want its own", st.PID, sid, err)
	}
	sb2, err := newBackend(t, state).Ensure(ctx, spec("conv-3"))
	if err != nil || sb2.Created || sb2.ID != sb.ID {
		t.Fatalf("ensure after the starter died: %+v, %v", sb2, err)
	}
}

// Concurrent Ensure calls, from separate Backend values, start one
// supervisor between them.
func TestConcurrentEnsureStartsOneSupervisor(t *testing.T) {
	state := t.TempDir()
	ctx := context.Background()
	cleanup(t, newBackend(t, state), "conv-4")
	var wg sync.WaitGroup
	pids := make([]int, 4)
	errs := make([]error, 4)
	for i := range pids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := newBackend(t, state).Ensure(ctx, spec("conv-4"))
			if err != nil {
				errs[i] = err
				return
			}
			st, err := sb.Client().Status(ctx)
			pids[i], errs[i] = st.PID, err
		}()
	}
	wg.Wait()
	for i := range pids {
		if errs[i] != nil || pids[i] != pids[0] {
			t.Fatalf("ensure %d: pid %d (%v), ensure 0: pid %d", i, pids[i], errs[i], pids[0])
		}
	}
}

// Preflight starts, creates and changes nothing, whether it passes or fails.
func TestPreflightCreatesNothing(t *testing.T) {
	state := t.TempDir()
	ctx := context.Background()
	b := newBackend(t, state)
	// An existing sandbox too, to show preflight leaves it alone.
	cleanup(t, b, "existing")
	if _, err := b.Ensure(ctx, spec("existing")); err != nil {
		t.Fatal(err)
	}
	before := tree(t, state)
	missing := filepath.Join(t.TempDir(), "missing")
	noSup, err := New(Config{StateDir: state, Command: []string{missing, "supervise"}})
	if err != nil {
		t.Fatal(err)
	}
	noState := newBackend(t, missing)
	for _, tc := range []struct {
		name  string
		b     *Backend
		spec  sandbox.Spec
		class string
	}{
		{name: "fresh conversation passes", b: b, spec: spec("fresh")},
		{name: "existing conversation passes", b: b, spec: spec("existing")},
		{name: "agent on PATH passes", b: b, spec: sandbox.Spec{ConversationID: "fresh", AgentCommand: []string{"sh"}}},
		{name: "bad conversation id", b: b, spec: spec("../escape"), class: sandbox.ClassInvalidSpec},
		{name: "supervisor missing", b: noSup, spec: spec("fresh"), class: sandbox.ClassSupervisorMissing},
		{name: "state dir missing", b: noState, spec: spec("fresh"), class: sandbox.ClassStateDir},
		{name: "agent missing", b: b, spec: sandbox.Spec{ConversationID: "fresh", AgentCommand: []string{missing}}, class: sandbox.ClassAgentMissing},
		{name: "agent not on PATH", b: b, spec: sandbox.Spec{ConversationID: "fresh", AgentCommand: []string{"no-such-agent-xyz"}}, class: sandbox.ClassAgentMissing},
		{name: "empty agent", b: b, spec: sandbox.Spec{ConversationID: "fresh"}, class: sandbox.ClassAgentMissing},
		// Limits: no per-conversation cgroup, so a limit is declined, never run unlimited.
		{name: "a limit it cannot apply", b: b, spec: sandbox.Spec{ConversationID: "fresh", AgentCommand: []string{"sh"},
			Limits: wire.Limits{MemoryBytes: 64 << 20}}, class: sandbox.ClassLimitsUnsupported},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.b.Preflight(ctx, tc.spec)
			var pe *sandbox.PreflightError
			switch {
			case tc.class == "" && err != nil:
				t.Fatalf("preflight: %v", err)
			case tc.class != "" && (!errors.As(err, &pe) || pe.Class != tc.class):
				t.Fatalf("preflight: %v, want class %s", err, tc.class)
			}
			if after := tree(t, state); !slices.Equal(before, after) {
				t.Fatalf("preflight changed the state directory:\nbefore %v\nafter  %v", before, after)
			}
			if _, err := os.Stat(missing); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("preflight created %s", missing)
			}
		})
	}
}

// Remove stops the supervisor and the agent it runs, and deletes the
// sandbox; removing it again is not an error.
func TestRemoveStopsSupervisorAndDeletesDirectory(t *testing.T) {
	state := t.TempDir()
	ctx := context.Background()
	b := newBackend(t, state)
	sb, err := b.Ensure(ctx, spec("conv-5"))
	if err != nil {
		t.Fatal(err)
	}
	c := sb.Client()
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	act, err := c.Activate(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := c.Run(ctx, act.ID, []string{demoAgent}, "!hang")
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ev, err := tr.Next()
	if err != nil {
		t.Fatal(err)
	}
	var started struct{ PID int }
	if err := json.Unmarshal(ev.Data, &started); err != nil || started.PID == 0 {
		t.Fatalf("first event %s: %v", ev.Data, err)
	}
	if err := b.Remove(ctx, "conv-5"); err != nil {
		t.Fatal(err)
	}
	for _, pid := range []int{st.PID, started.PID} {
		if err := testbin.WaitGone(pid, waitLimit); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(b.Dir("conv-5")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("sandbox directory still there: %v", err)
	}
	if _, err := c.Status(ctx); !errors.Is(err, sandbox.ErrUnavailable) {
		t.Fatalf("status after remove: %v", err)
	}
	if err := b.Remove(ctx, "conv-5"); err != nil {
		t.Fatalf("second remove: %v", err)
	}
	// A new sandbox of the same conversation is a new identity.
	cleanup(t, b, "conv-5")
	sb2, err := b.Ensure(ctx, spec("conv-5"))
	if err != nil || sb2.ID == sb.ID {
		t.Fatalf("ensure after remove: %+v (%v), old id %s", sb2, err, sb.ID)
	}
}

func tree(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		out = append(out, fmt.Sprintf("%s %v %d %d", path, info.Mode(), info.Size(), info.ModTime().UnixNano()))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

// Issue 6: the runner's sweep finds every conversation with a sandbox
// directory — running supervisor or not, from a fresh Backend as after a
// restart — and nothing that cannot name a conversation; once removed, a
// conversation is no longer listed.
func TestConversationsListsSandboxDirectories(t *testing.T) {
	state := t.TempDir()
	ctx := context.Background()
	b := newBackend(t, state)
	if got, err := b.Conversations(ctx); err != nil || len(got) != 0 {
		t.Fatalf("before any sandbox: %v, %v", got, err)
	}
	for _, conv := range []string{"conv-b", "conv-a"} {
		cleanup(t, b, conv)
		if _, err := b.Ensure(ctx, spec(conv)); err != nil {
			t.Fatal(err)
		}
	}
	// A sandbox whose supervisor is gone is still a sandbox to sweep.
	if err := os.MkdirAll(b.Workspace("conv-c"), 0o700); err != nil {
		t.Fatal(err)
	}
	cleanup(t, b, "conv-c")
	// Neither a file nor a name Remove would refuse is a conversation.
	if err := os.WriteFile(filepath.Join(state, "sandboxes", "stray-file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(state, "sandboxes", ".hidden"), 0o700); err != nil {
		t.Fatal(err)
	}

	want := []string{"conv-a", "conv-b", "conv-c"}
	if got, err := newBackend(t, state).Conversations(ctx); err != nil || !slices.Equal(got, want) {
		t.Fatalf("conversations %v (%v), want %v", got, err, want)
	}
	if err := b.Remove(ctx, "conv-b"); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Conversations(ctx); err != nil || !slices.Equal(got, []string{"conv-a", "conv-c"}) {
		t.Fatalf("after removing conv-b: %v, %v", got, err)
	}
}

// K8 per sandbox: a sandbox records the cluster of the turn that created
// it (0600, beside its id) and keeps it: a later Ensure granted by another
// cluster changes nothing, a fresh Backend (a restart) lists the same. A
// sandbox made with no cluster (a control plane that sends none, or an
// earlier release) lists none; a record that cannot be read lists
// sandbox.ClusterUnreadable, which no answer matches.
func TestListedNamesTheClusterCreatedUnder(t *testing.T) {
	state := t.TempDir()
	ctx := context.Background()
	b := newBackend(t, state)
	ensure := func(conv, cluster string) {
		t.Helper()
		sp := spec(conv)
		sp.Cluster = cluster
		if _, err := b.Ensure(ctx, sp); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []string{"conv-a", "conv-b", "conv-c"} {
		cleanup(t, b, c)
	}
	ensure("conv-a", "cluster_a")
	ensure("conv-a", "cluster_b") // found, not created: its cluster stays
	ensure("conv-b", "")
	ensure("conv-c", "cluster_b")
	if fi, err := os.Stat(filepath.Join(b.Dir("conv-a"), clusterFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("cluster file %v (%v), want mode 0600", fi, err)
	}
	if err := os.WriteFile(filepath.Join(b.Dir("conv-c"), clusterFile), []byte("two words\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	want := []sandbox.Listed{
		{ConversationID: "conv-a", Cluster: "cluster_a"},
		{ConversationID: "conv-b"},
		{ConversationID: "conv-c", Cluster: sandbox.ClusterUnreadable},
	}
	if got, err := newBackend(t, state).Listed(ctx); err != nil || !slices.Equal(got, want) {
		t.Fatalf("listed %v (%v), want %v", got, err, want)
	}
	// An identity that could not be read back is never recorded.
	sp := spec("conv-d")
	sp.Cluster = "a/b"
	cleanup(t, b, "conv-d")
	if _, err := b.Ensure(ctx, sp); err == nil {
		t.Fatal("Ensure recorded a cluster identity holding a slash")
	}
}

// checkConversation accepts exactly the ids that can name a directory of
// their own.
func TestCheckConversation(t *testing.T) {
	long := strings.Repeat("a", 128)
	for id, ok := range map[string]bool{
		"conv_1": true, "a.b-c_D9": true, "-x": true, "_": true, long: true,
		"": false, ".": false, "..": false, ".hidden": false, "../escape": false,
		"a/b": false, "a b": false, long + "a": false, "é": false, "a\x00": false,
	} {
		if err := checkConversation(id); (err == nil) != ok {
			t.Errorf("checkConversation(%q) = %v, want ok=%v", id, err, ok)
		}
	}
}
