package process

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/runnerd/runnerd/internal/atomicfile"
	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/internal/testbin"
)

// scribbler is an agent that overwrites every file of its workspace (its
// working directory) with 999, and writes 999 where the previous release
// kept the supervisor's native turn.
var scribbler = []string{"/bin/sh", "-c",
	`find . -type f -exec sh -c 'for f; do echo 999 > "$f"; done' _ {} + && mkdir -p .runnerd && echo 999 > .runnerd/native_turn`}

// killSupervisor kills the sandbox's supervisor and waits until it is gone.
func killSupervisor(t *testing.T, c *sandbox.Client) int {
	t.Helper()
	st, err := c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := testbin.WaitGone(st.PID, waitLimit); err != nil {
		t.Fatal(err)
	}
	return st.PID
}

// R26/R31, issue 12 §8: the supervisor keeps its state beside the
// workspace, not in it. An agent that overwrites its whole workspace, the
// previous release's .runnerd/native_turn included, does not change the
// boundary the supervisor recorded: a new supervisor over the same sandbox
// reports it. (Not proven, and not true: that an agent set on it cannot
// reach the state — it runs as the same user; see the package doc.)
func TestScribblingAgentCannotChangeRecordedBoundary(t *testing.T) {
	if _, err := exec.LookPath("find"); err != nil {
		t.Skip("no find(1) for the scribbling agent")
	}
	state := t.TempDir()
	ctx := context.Background()
	b := newBackend(t, state)
	cleanup(t, b, "conv-scribble")
	sb, err := b.Ensure(ctx, spec("conv-scribble"))
	if err != nil {
		t.Fatal(err)
	}
	c := sb.Client()
	if _, nt := turn(t, c, "first"); nt != 1 {
		t.Fatalf("first turn ended at %d", nt)
	}
	act, err := c.Activate(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := c.Run(ctx, act.ID, scribbler, "scribble")
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := tr.Next(); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			break
		}
	}
	tr.Close()
	if res, err := tr.Result(); err != nil || res.ExitCode != 0 || res.NativeTurn != 2 {
		t.Fatalf("scribbling turn: %+v, %v; want exit 0 at native turn 2", res, err)
	}
	if b, err := os.ReadFile(filepath.Join(b.Workspace("conv-scribble"), ".runnerd", "native_turn")); err != nil || strings.TrimSpace(string(b)) != "999" {
		t.Fatalf("the agent did not scribble (%q, %v): the test proves nothing", b, err)
	}

	killSupervisor(t, c)
	sb2, err := newBackend(t, state).Ensure(ctx, spec("conv-scribble"))
	if err != nil {
		t.Fatal(err)
	}
	st, err := sb2.Client().Status(ctx)
	if err != nil || st.NativeTurn != 2 {
		t.Fatalf("recorded native turn after the restart: %+v, %v; want 2", st, err)
	}
	fi, err := os.Stat(b.StateDir("conv-scribble"))
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("state directory %v, %v; want mode 0700", fi, err)
	}
}

// A sandbox of the previous release — the native turn in
// WORKSPACE/.runnerd, its supervisor started without --state — keeps
// working: Ensure replaces the supervisor and moves the boundary out of the
// workspace, and the session continues from it.
func TestPreviousLayoutIsMigrated(t *testing.T) {
	state := t.TempDir()
	ctx := context.Background()
	b := newBackend(t, state)
	cleanup(t, b, "conv-old")
	if _, err := b.Ensure(ctx, spec("conv-old")); err != nil {
		t.Fatal(err)
	}
	oldPID := killSupervisor(t, (&sandbox.Sandbox{Socket: b.SocketPath("conv-old")}).Client())
	legacy := filepath.Join(b.Workspace("conv-old"), ".runnerd", "native_turn")
	if err := os.MkdirAll(filepath.Dir(legacy), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(legacy, []byte("7\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	id, err := readID(b.Dir("conv-old"))
	if err != nil {
		t.Fatal(err)
	}
	// The previous release's command line: no --state.
	old := exec.Command(os.Args[0], "supervise", "--socket", b.SocketPath("conv-old"),
		"--workspace", b.Workspace("conv-old"), "--id", id, "--ready-fd", "3")
	old.Env = testEnv
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old.ExtraFiles = []*os.File{pw}
	if err := old.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	buf := make([]byte, 6)
	_, _ = io.ReadFull(pr, buf)
	pr.Close()
	t.Cleanup(func() { _ = old.Process.Kill(); _ = old.Wait() })
	// This release's code stands in for the previous release's, which kept
	// no state beside the workspace: remove what it wrote there.
	if err := os.RemoveAll(b.StateDir("conv-old")); err != nil {
		t.Fatal(err)
	}
	if err := atomicfile.Write(filepath.Join(b.Dir("conv-old"), "supervisor.pid"), []byte(strconv.Itoa(old.Process.Pid)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	sb, err := newBackend(t, state).Ensure(ctx, spec("conv-old"))
	if err != nil {
		t.Fatal(err)
	}
	st, err := sb.Client().Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !sb.Created || st.PID == old.Process.Pid || st.PID == oldPID {
		t.Fatalf("ensure %+v, supervisor %d: want the previous release's supervisor %d replaced", sb, st.PID, old.Process.Pid)
	}
	if st.NativeTurn != 7 {
		t.Fatalf("native turn after the migration %d, want the previous release's 7", st.NativeTurn)
	}
	if _, err := os.Lstat(legacy); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the previous release's state file is still in the workspace: %v", err)
	}
	if act, _ := turn(t, sb.Client(), "after the upgrade"); act.NativeTurn != 7 {
		t.Fatalf("the turn after the migration resumed from %d, want 7", act.NativeTurn)
	}
}

// What an agent of this release writes where the previous release kept
// the boundary is never taken for one: a new sandbox's supervisor writes
// its state at once, so a later start adopts nothing — even when the agent
// wrote there before any turn ended.
func TestAgentWrittenLegacyFileIsNeverAdopted(t *testing.T) {
	state := t.TempDir()
	ctx := context.Background()
	b := newBackend(t, state)
	cleanup(t, b, "conv-new")
	sb, err := b.Ensure(ctx, spec("conv-new"))
	if err != nil {
		t.Fatal(err)
	}
	killSupervisor(t, sb.Client())
	legacy := filepath.Join(b.Workspace("conv-new"), ".runnerd", "native_turn")
	if err := os.MkdirAll(filepath.Dir(legacy), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(legacy, []byte("999\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sb2, err := newBackend(t, state).Ensure(ctx, spec("conv-new"))
	if err != nil {
		t.Fatal(err)
	}
	if st, err := sb2.Client().Status(ctx); err != nil || st.NativeTurn != 0 {
		t.Fatalf("status after the restart %+v, %v; want native turn 0, not the agent's 999", st, err)
	}
}
