package process

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"testing"

	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/internal/pidfd"
)

// S1: Stop ends an idle supervisor and keeps its sandbox — id, workspace,
// recorded native turn — and the next Ensure starts a supervisor over
// them: the same sandbox, the session continued, the old receipts gone
// (R28), as after a supervisor restart.
func TestStopKeepsSandboxAndEnsureWakesIt(t *testing.T) {
	state := t.TempDir()
	ctx := context.Background()
	var logs bytes.Buffer
	b, err := New(Config{StateDir: state, Command: []string{os.Args[0], "supervise"}, Env: testEnv,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	cleanup(t, b, "conv-idle")
	sb, err := b.Ensure(ctx, spec("conv-idle"))
	if err != nil {
		t.Fatal(err)
	}
	act, nt := turn(t, sb.Client(), "before the eviction")
	st, err := sb.Client().Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b.Workspace("conv-idle")+"/kept", []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}

	// idle says no: nothing is stopped.
	if stopped, err := b.Stop(ctx, "conv-idle", func() bool { return false }); stopped || err != nil {
		t.Fatalf("Stop with idle false: %v, %v", stopped, err)
	}
	if _, err := sb.Client().Status(ctx); err != nil {
		t.Fatalf("the supervisor stopped though idle said no: %v", err)
	}

	asked := false
	stopped, err := b.Stop(ctx, "conv-idle", func() bool { asked = true; return true })
	if !stopped || err != nil || !asked {
		t.Fatalf("Stop: stopped %v, err %v, idle asked %v", stopped, err, asked)
	}
	if err := pidfd.WaitExit(st.PID, 0); err != nil { // Stop returns once it is gone
		t.Fatalf("the supervisor (pid %d) still runs after Stop: %v", st.PID, err)
	}
	if !bytes.Contains(logs.Bytes(), []byte(RecordSupervisorStopped)) {
		t.Errorf("no %s record:\n%s", RecordSupervisorStopped, logs.String())
	}
	if _, err := os.Stat(b.Workspace("conv-idle") + "/kept"); err != nil {
		t.Fatalf("the workspace was not kept: %v", err)
	}
	// Stopped already: nothing to stop, and idle is not even asked.
	if again, err := b.Stop(ctx, "conv-idle", func() bool { t.Error("idle asked of a stopped sandbox"); return true }); again || err != nil {
		t.Fatalf("a second Stop: %v, %v", again, err)
	}

	sb2, err := b.Ensure(ctx, spec("conv-idle"))
	if err != nil {
		t.Fatal(err)
	}
	if !sb2.Created || sb2.ID != sb.ID {
		t.Fatalf("ensure after Stop %+v, before %+v", sb2, sb)
	}
	st2, err := sb2.Client().Status(ctx)
	if err != nil || st2.PID == st.PID || st2.NativeTurn != nt {
		t.Fatalf("status after the wake %+v (%v), before %+v", st2, err, st)
	}
	if _, err := sb2.Client().Settle(ctx, act.ID); !errors.Is(err, sandbox.ErrUnknownActivation) {
		t.Fatalf("settle of the old activation after the wake: %v, want ErrUnknownActivation", err)
	}
	if _, nt2 := turn(t, sb2.Client(), "after the wake"); nt2 != nt+1 {
		t.Fatalf("native turn %d after %d", nt2, nt)
	}
}

// S1: a supervisor that says it runs a turn is never stopped, whatever
// idle answers (a turn this daemon does not hold: an earlier run's child).
func TestStopLeavesBusySupervisor(t *testing.T) {
	state := t.TempDir()
	ctx := context.Background()
	b := newBackend(t, state)
	cleanup(t, b, "conv-busy")
	sb, err := b.Ensure(ctx, spec("conv-busy"))
	if err != nil {
		t.Fatal(err)
	}
	c := sb.Client()
	act, err := c.Activate(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := c.Run(ctx, act.ID, []string{demoAgent}, "!hang")
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if _, err := tr.Next(); err != nil { // turn.started: the agent runs
		t.Fatal(err)
	}
	stopped, err := b.Stop(ctx, "conv-busy", func() bool { return true })
	if stopped || !errors.Is(err, sandbox.ErrBusy) {
		t.Fatalf("Stop of a busy supervisor: stopped %v, err %v, want ErrBusy", stopped, err)
	}
	if st, err := c.Status(ctx); err != nil || !st.Busy {
		t.Fatalf("the busy supervisor after Stop: %+v, %v", st, err)
	}
}
