package handover

import (
	"os"
	"path/filepath"
	"testing"
	"time"
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
	t.Run("a spare assigned its turn", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		spare := testConfig(t, "result")
		spare.Reattach = filepath.Join(dir, "spare-1.sock")
		c, err := Prepare(spare)
		if err != nil {
			t.Fatal(err)
		}
		if c.Exited() {
			t.Fatal("a waiting spare reported exited")
		}
		// The turn's configuration: its own socket name, hooks and timeout.
		turnCfg := Config{Path: "/not/used", Reattach: filepath.Join(dir, "att_1.sock"), ExecutionTimeout: time.Minute}
		var started []int
		var result []byte
		turnCfg.Started = func(pid int) { started = append(started, pid) }
		turnCfg.OnResult = func(b []byte) { result = append([]byte(nil), b...) }
		if err := c.Assign(turnCfg); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(spare.Reattach); !os.IsNotExist(err) {
			t.Fatalf("the spare's socket name is still there: %v", err)
		}
		if _, err := os.Stat(turnCfg.Reattach); err != nil {
			t.Fatalf("no re-attach socket under the turn's name: %v", err)
		}
		if len(started) != 0 {
			t.Fatal("Started ran before the payload")
		}
		turn, err := c.Launch(t.Context(), testPayload())
		if err != nil {
			t.Fatal(err)
		}
		if end := turn.Wait(); end.Outcome != OutcomeResult || string(result) != "done" {
			t.Fatalf("end %+v, OnResult got %q", end, result)
		}
		if len(started) != 1 || started[0] != turn.PID() || turn.PID() != c.PID() {
			t.Fatalf("Started ran with %v, want the spare's pid %d", started, c.PID())
		}
	})
	t.Run("a spare that died is seen exited", func(t *testing.T) {
		t.Parallel()
		c, err := Prepare(testConfig(t, "die-before-payload"))
		if err != nil {
			t.Fatal(err)
		}
		if err := awaitExited(c.t.pidfd); err != nil {
			t.Fatal(err)
		}
		if !c.Exited() {
			t.Fatal("a dead spare reported alive")
		}
		c.Close()
	})
	t.Run("a spare without a re-attach socket cannot take a turn with one", func(t *testing.T) {
		t.Parallel()
		c, err := Prepare(testConfig(t, "parent-gone"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := c.Assign(Config{Reattach: filepath.Join(t.TempDir(), "att.sock")}); err == nil {
			t.Fatal("Assign gave a socket to a child started without one")
		}
	})
}
