package runner

import (
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// K6, R5: a turn child that ignores its STOP, SIGTERM and its own
// execution deadline is killed by the daemon's execution timer (SIGKILL
// after StopGrace and KillGrace): the turn fails with the execution
// timeout's own class, not as a child that was killed.
func TestExecutionTimeoutOfAKilledChild(t *testing.T) {
	c := newCP(t)
	j := c.enqueue("deaf")
	r := startDaemon(t, c, func(cfg *Config) {
		cfg.ExecTimeout = 4 * time.Second // long enough for the child to accept first, however slow the machine
		cfg.ExecTimeoutMargin = 200 * time.Millisecond
	})
	defer func() {
		if t.Failed() {
			t.Logf("records:\n%s", r.logs)
		}
	}()
	waitFor(t, "the job to end", 30*time.Second, ended(c, j.ID))
	logs := r.logs.String()
	if !strings.Contains(logs, `"msg":"`+MsgTurnEnded+`","job_id":"`+j.ID) ||
		!strings.Contains(logs, `"outcome":"killed","exit_code":-1,"signal":"killed","stopped":false,"timed_out":true`) {
		t.Fatal("the child was not accepted and then killed by SIGKILL on the execution timeout")
	}
	if got := c.job(j.ID).Attempts[0]; got.Outcome != wire.OutcomeFailed {
		t.Fatalf("attempt outcome %s, want failed", got.Outcome)
	}
	if !strings.Contains(logs, `"msg":"agent_turn_failed","job_id":"`+j.ID) || !strings.Contains(logs, `"stage":"turn","class":"`+ClassExecutionTimeout+`"`) {
		t.Fatalf("the turn did not fail with class %s", ClassExecutionTimeout)
	}
	if strings.Contains(logs, `"class":"`+ClassKilled+`"`) {
		t.Fatalf("the turn was reported with class %s", ClassKilled)
	}
}
