package runner

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runnerd/runnerd/handover"
	"github.com/runnerd/runnerd/internal/boottime"
	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// orphanTurn runs an earlier daemon (oldDaemon, a re-executed test binary)
// that launches the claim's turn child (fakeTurn with its prompt) on the
// re-attach socket d gives the attempt, and kills it with SIGKILL once the
// child accepted: the child waits for the next daemon. It returns the
// child's pid; the test's end kills the child's group.
func orphanTurn(t *testing.T, d *Daemon, cl wire.Claim) int {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(oldDaemonSpec{
		Socket: d.state.socket(cl.AttemptID),
		Echo:   handover.Echo{AttemptID: cl.AttemptID, LeaseGeneration: cl.LeaseGeneration},
		Data:   d.payload(cl),
	})
	spec := filepath.Join(t.TempDir(), "spec.json")
	if err := os.WriteFile(spec, b, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "old-daemon", spec)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, rerr := bufio.NewReader(out).ReadString('\n')
	cmd.Process.Kill()
	cmd.Wait()
	f := strings.Fields(line)
	pid, perr := 0, error(nil)
	if len(f) == 2 && f[0] == "ready" {
		pid, perr = strconv.Atoi(f[1])
	}
	if rerr != nil || perr != nil || pid <= 0 {
		t.Fatalf("the earlier daemon said %q (%v)", line, rerr)
	}
	t.Cleanup(func() {
		syscall.Kill(-pid, syscall.SIGKILL)
		syscall.Kill(-pid, syscall.SIGCONT)
	})
	return pid
}

// P5, R34, K5, K6: after a restart, a turn child that is alive but does
// not answer REATTACH (frozen: SIGSTOP) is no evidence that it is gone.
// The daemon keeps its record and renews its lease, tries again, never
// finishes it worker_lost, and re-attaches once it answers: the turn ends
// with the child's own RESULT, one attempt. The re-attached turn's
// execution timer counts on CLOCK_BOOTTIME: the record's wall-clock claim
// time lies three hours back (a forward step of the clock), and the turn
// still gets its whole execution timeout, not the one second left on the
// wall clock.
func TestRestartWaitsForSilentChild(t *testing.T) {
	c := newCP(t)
	j := c.enqueue("reattach")
	cl := c.claim(testTimings.LeaseTTL)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	d, logs := newTestDaemon(t, c, func(cfg *Config) {
		cfg.Executable = exe
		cfg.ChildStderr = os.Stderr
	})
	rec := record{Claim: cl, ClaimedAt: time.Now().Add(-3 * time.Hour), ClaimedBoot: boottime.Now()}
	if err := d.state.save(rec); err != nil {
		t.Fatal(err)
	}
	pid := orphanTurn(t, d, cl)
	if err := fleet.Freeze(pid, time.Minute); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("records:\n%s", logs)
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if got := d.recoverOne(ctx, mustLoadOne(t, d)); got != decisionPending {
		t.Fatalf("decision %q for a frozen child, want %q", got, decisionPending)
	}
	// It tries again, and again, while the child stays frozen; the attempt
	// stays the child's and nothing is reported.
	waitFor(t, "tries to re-attach", 20*time.Second, func() bool { return logs.count(MsgReattachPending) >= 4 })
	if a := c.job(j.ID).Attempts[0]; a.State != wire.AttemptRunning || !d.state.exists(cl.AttemptID) || logs.has(MsgReportSent) {
		t.Fatalf("a frozen child's attempt was resolved: attempt %s, persisted %v", a.State, d.state.exists(cl.AttemptID))
	}
	if !alive(pid) {
		t.Fatal("the frozen child is gone")
	}
	if err := syscall.Kill(-pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the job to end", 30*time.Second, ended(c, j.ID))
	d.attempts.Wait()
	got := c.job(j.ID)
	if len(got.Attempts) != 1 || got.Attempts[0].Outcome != wire.OutcomeFailed || got.WorkerLostCount != 0 {
		t.Fatalf("job %s, %d attempts, outcome %s, worker lost %d: want the child's own failed/scripted",
			got.State, len(got.Attempts), got.Attempts[0].Outcome, got.WorkerLostCount)
	}
	if !strings.Contains(logs.String(), `"msg":"agent_turn_failed","job_id":"`+j.ID) || !strings.Contains(logs.String(), `"class":"scripted"`) {
		t.Fatalf("the report did not come from the child's RESULT")
	}
	if !strings.Contains(logs.String(), `"msg":"`+MsgRecovered+`","job_id":"`+j.ID+`","attempt_id":"`+cl.AttemptID+`","decision":"`+decisionReattached+`"`) {
		t.Fatalf("no %s record with decision %s", MsgRecovered, decisionReattached)
	}
	m := regexp.MustCompile(`"msg":"` + MsgTurnReattached + `".*"exec_left_ms":(\d+)`).FindStringSubmatch(logs.String())
	if m == nil {
		t.Fatalf("no %s record with exec_left_ms", MsgTurnReattached)
	}
	if left, _ := strconv.ParseInt(m[1], 10, 64); time.Duration(left)*time.Millisecond < d.cfg.ExecTimeout {
		t.Fatalf("the re-attached turn's execution timer has %v left, want at least ExecTimeout %v: it counted the wall clock's step",
			time.Duration(left)*time.Millisecond, d.cfg.ExecTimeout)
	}
	if persisted(d) != 0 {
		t.Fatal("the reported attempt is still persisted")
	}
}
