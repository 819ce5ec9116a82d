package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// mountTmpfs mounts a tmpfs of size (mount(8)'s size=, e.g. "32m") on
// dir, unmounted (lazily: a leftover's descriptor must not keep it) when
// the test ends. It skips without root or mount(8).
func mountTmpfs(t *testing.T, dir, size string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
}

// S2 end to end on the process backend, its state directory on a real
// 32 MiB tmpfs and --min-free-disk 25 %: three conversations A, B, C run
// a turn each, in that order, and C's second turn holds (!await) while a
// filler file takes the free space below the floor. Before its next claim
// the daemon stops the idle sandboxes oldest first — A, then B, cause
// pressure — and never C's, whose turn runs; a stop frees no disk, so it
// is still short and withholds first turns: the host JSON (Admin →
// Servers) shows sandbox_pressure, and a new conversation D's first turn
// stays queued while A's next message — a returning turn — wakes its
// sandbox and runs. The conversation JSON says A's sandbox is stopped
// while it is. With the filler
// gone, the pressure clears and D's first turn runs.
func TestS2HostPressureProcess(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	mountTmpfs(t, e.stateDir, "32m")
	e.startDaemon(func(c *fleet.DaemonConfig) {
		c.Args = append(c.Args, "--sandbox-idle=0", "--min-free-disk=25%", "--sandbox-sweep=1h")
	})
	var convs []wire.Conversation
	for _, name := range []string{"A", "B", "C"} {
		c := e.conversation("pressure " + name)
		if j := e.waitEnded(e.send(c.ID, "hello "+name).ID); j.State != wire.JobSucceeded {
			t.Fatalf("the first turn of %s: %s", name, describeJob(j))
		}
		convs = append(convs, c)
	}
	a, b, c := convs[0], convs[1], convs[2]
	held := e.send(c.ID, "!await release")
	e.waitJob(held.ID, "to run", func(j wire.Job) bool { return j.State == wire.JobRunning })
	cSup, ok := e.supervisorOf(c.ID)
	if !ok {
		t.Fatal("no supervisor runs for the conversation whose turn is held")
	}
	if s, _, err := e.user.Server(e.ctx, e.host); err != nil || s.SandboxPressure != nil {
		t.Fatalf("before the filler: server %+v, %v; want no sandbox_pressure", s, err)
	}

	// Fill the tmpfs to 28 MiB of 32: 4 MiB free, below the 8 MiB floor.
	filler := filepath.Join(e.stateDir, "filler")
	if err := os.WriteFile(filler, make([]byte, 28<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := e.waitServer("reporting sandbox_pressure", func(s wire.Server) bool { return s.SandboxPressure != nil })
	if p := srv.SandboxPressure; p.Resource != wire.PressureDisk || p.FreeBytes >= p.MinFreeBytes || p.TotalBytes < 30<<20 || p.Since.IsZero() {
		t.Fatalf("sandbox_pressure %+v: want disk, free below min_free_bytes (a quarter of 32 MiB)", *p)
	}
	// The record of the pressure comes after the evictions it made.
	evA := e.waitRecord(diagnostics.MsgSandboxEvicted, a.ID)
	evB := e.waitRecord(diagnostics.MsgSandboxEvicted, b.ID)
	for _, ev := range []map[string]any{evA, evB} {
		if ev[diagnostics.KeyCause] != "pressure" {
			t.Fatalf("eviction %v: want cause pressure", ev)
		}
	}
	ta, errA := time.Parse(time.RFC3339Nano, evA["time"].(string))
	tb, errB := time.Parse(time.RFC3339Nano, evB["time"].(string))
	if errA != nil || errB != nil || tb.Before(ta) {
		t.Fatalf("B (idle since later) was evicted at %v, A at %v (%v, %v): want the longest idle first", tb, ta, errA, errB)
	}
	if recs := e.daemonRecords(diagnostics.MsgSandboxEvicted, c.ID); len(recs) != 0 {
		t.Fatalf("the sandbox of the running turn was evicted: %v", recs)
	}
	if p, ok := e.supervisorOf(c.ID); !ok || p.Pid != cSup.Pid {
		t.Fatalf("the running turn's supervisor %d is gone or replaced (%+v, %v)", cSup.Pid, p, ok)
	}
	for _, conv := range []wire.Conversation{a, b} {
		if p, ok := e.supervisorOf(conv.ID); ok {
			if _, err := waitGone(p.Pid, waitFor); err != nil {
				t.Fatalf("the evicted supervisor of %s: %v", conv.Title, err)
			}
		}
	}
	// The conversation JSON says so, from the host's report.
	e.waitConv(a.ID, "its sandbox stopped", func(cv wire.Conversation) bool { return cv.SandboxState == wire.SandboxStopped })

	// A new conversation's first turn is withheld; A's next one runs.
	d := e.conversation("pressure D")
	first := e.send(d.ID, "hello D")
	if j := e.woken(a, "A again"); j.State != wire.JobSucceeded {
		t.Fatalf("A's returning turn: %s", describeJob(j))
	}
	if j := e.job(first.ID); j.State != wire.JobQueued {
		t.Fatalf("D's first turn under pressure: %s, want still queued", describeJob(j))
	}
	if s, _, err := e.user.Server(e.ctx, e.host); err != nil || s.SandboxPressure == nil {
		t.Fatalf("after A's turn: server %+v, %v; want sandbox_pressure still", s, err)
	}

	// Space again: the pressure clears and D's first turn runs.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if j := e.waitEnded(first.ID); j.State != wire.JobSucceeded {
		t.Fatalf("D's first turn after the pressure: %s", describeJob(j))
	}
	e.waitServer("clearing sandbox_pressure", func(s wire.Server) bool { return s.SandboxPressure == nil })
	if err := os.WriteFile(filepath.Join(fleet.Workspace(e.stateDir, c.ID), "release"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if j := e.waitEnded(held.ID); j.State != wire.JobSucceeded {
		t.Fatalf("the held turn: %s", describeJob(j))
	}
	e.assertPromptsOnce(a.ID, "hello A", "A again")
}

// waitConv waits until the conversation answers cond.
func (e *env) waitConv(id, what string, cond func(wire.Conversation) bool) wire.Conversation {
	e.t.Helper()
	ctx, cancel := e.waitCtx()
	defer cancel()
	var cv wire.Conversation
	err := fleet.Poll(ctx, tick, "conversation "+what, func(ctx context.Context) (bool, error) {
		var err error
		cv, err = e.user.Conversation(ctx, id)
		return err == nil && cond(cv), nil
	})
	if err != nil {
		e.t.Fatalf("%v; now: %+v", err, cv)
	}
	return cv
}
