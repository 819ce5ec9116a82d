package handover

import (
	"os"
	"path/filepath"
	"testing"
)

// TestPreparedChild: a child started before its payload (the daemon's
// launch starts it before the claim's flush). Handed its payload later, it
// runs its turn as a launched child does; closed before, it sees EOF and
// exits having accepted nothing; dead before, its claim may be released,
// as a fresh child's would (R33).
func TestPreparedChild(t *testing.T) {
	t.Run("handed its payload later", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t, "result")
		var started []int
		cfg.Started = func(pid int) { started = append(started, pid) }
		c, err := Prepare(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if len(started) != 0 {
			t.Fatalf("Started ran at Prepare (pid %v): the payload is Launch's", started)
		}
		turn, err := c.Launch(t.Context(), testPayload())
		if err != nil {
			t.Fatal(err)
		}
		if end := turn.Wait(); end.Outcome != OutcomeResult || string(end.Result) != "done" {
			t.Fatalf("end %+v, want result \"done\"", end)
		}
		if len(started) != 1 || started[0] != turn.PID() {
			t.Fatalf("Started ran with %v, want once with the child's pid %d", started, turn.PID())
		}
	})
	t.Run("closed before its payload", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t, "parent-gone")
		cfg.Reattach = filepath.Join(t.TempDir(), "att.sock")
		c, err := Prepare(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(cfg.Reattach); err != nil {
			t.Fatalf("no re-attach socket while the child waits: %v", err)
		}
		c.Close()
		if ws, ok := waitStatus(c.t.state); !ok || !ws.Exited() || ws.ExitStatus() != exitParentGone {
			t.Fatalf("child state %v, want exit %d: EOF before any payload", c.t.state, exitParentGone)
		}
		if _, err := os.Stat(cfg.Reattach); !os.IsNotExist(err) {
			t.Fatalf("re-attach socket left behind: %v", err)
		}
	})
	t.Run("dead before its payload", func(t *testing.T) {
		t.Parallel()
		c, err := Prepare(testConfig(t, "die-before-payload"))
		if err != nil {
			t.Fatal(err)
		}
		if err := awaitExited(c.t.pidfd); err != nil {
			t.Fatal(err)
		}
		turn, err := c.Launch(t.Context(), testPayload())
		na := notAccepted(t, turn, err)
		if na.Outcome != OutcomePayloadUndelivered && !(na.Outcome == OutcomeDeclined && na.Class == ClassClosed) {
			t.Fatalf("outcome %v (%s), want payload_undelivered or declined (closed)", na.Outcome, na.Class)
		}
		if r, ok := na.Release(); !ok || !r.Valid() {
			t.Fatalf("no release offered for %v", na.Outcome)
		}
	})
	t.Run("spawn failed", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t, "result")
		cfg.Path = filepath.Join(t.TempDir(), "missing")
		c, err := Prepare(cfg)
		na := notAccepted(t, nil, err)
		if c != nil || na.Outcome != OutcomeSpawnFailed {
			t.Fatalf("Prepare = %v, %v; want spawn failed", c, na.Outcome)
		}
		if _, ok := na.Release(); !ok {
			t.Fatal("no release offered for a spawn that failed")
		}
	})
}
