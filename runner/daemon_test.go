package runner

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/wire"
)

// These tests run the whole daemon against the real control plane, with
// real turn children: the test binary re-entered as "turn" (fakeTurn). Real
// processes and sockets cannot run in a synctest bubble, so they use short
// real timings and wait on observable state, never on a fixed sleep.

// running is a daemon started by startDaemon.
type running struct {
	d      *Daemon
	logs   *logBuf
	cancel context.CancelFunc
	done   chan struct{}
}

func startDaemon(t *testing.T, c *cp, mod func(*Config)) *running {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	d, logs := newTestDaemon(t, c, func(cfg *Config) {
		cfg.Executable = exe
		cfg.ChildStderr = os.Stderr
		cfg.Capacity = 1
		if mod != nil {
			mod(cfg)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{d: d, logs: logs, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		if err := d.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	t.Cleanup(func() {
		d.Drain()
		select {
		case <-r.done:
		case <-time.After(20 * time.Second):
			cancel()
			<-r.done
			t.Errorf("the daemon did not drain within 20s")
		}
		cancel()
	})
	return r
}

// stopped waits for Run to return.
func (r *running) stopped(t *testing.T, limit time.Duration) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(limit):
		t.Fatalf("Run still running after %v", limit)
	}
}

func ended(c *cp, id string) func() bool {
	return func() bool {
		s := c.job(id).State
		return s != wire.JobQueued && s != wire.JobRunning
	}
}

func persisted(d *Daemon) int {
	recs, _ := d.state.load()
	return len(recs)
}

// The RESULT the child sends is persisted, then sent; then the attempt is
// forgotten. The child sees none of systemd's variables (it would decline).
func TestTurnResultIsReported(t *testing.T) {
	c := newCP(t)
	j := c.enqueue("result")
	r := startDaemon(t, c, func(cfg *Config) {
		cfg.ChildEnv = append(os.Environ(), "NOTIFY_SOCKET=/run/systemd/notify", "WATCHDOG_USEC=60000000", "WATCHDOG_PID=1")
	})
	waitFor(t, "the job to end", 15*time.Second, ended(c, j.ID))
	got := c.job(j.ID)
	if got.State != wire.JobFailed || got.Attempts[0].Outcome != wire.OutcomeFailed || len(got.Attempts) != 1 {
		t.Fatalf("job %s, attempts %+v\nthe daemon's records:\n%s", got.State, got.Attempts, r.logs)
	}
	waitFor(t, "the attempt to be forgotten", 5*time.Second, func() bool { return persisted(r.d) == 0 })
	for _, msg := range []string{"agent_attempt_claimed", MsgTurnAccepted, MsgTurnEnded, MsgReportSent} {
		if !r.logs.has(msg) {
			t.Errorf("no %s record", msg)
		}
	}
	if !strings.Contains(r.logs.String(), `"msg":"agent_turn_failed","job_id":"`+j.ID) || !strings.Contains(r.logs.String(), `"stage":"turn","class":"scripted"`) {
		t.Errorf("no agent_turn_failed record with the child's class:\n%s", r.logs)
	}
	r.logs.noSecrets(t, c.hostToken)
	if strings.Contains(r.logs.String(), "rdw_") {
		t.Error("a worker token reached a record")
	}
	// The daemon's series moved with the turn.
	m := r.d.m
	var h dto.Metric
	if err := m.ClaimToAccept.Write(&h); err != nil {
		t.Fatal(err)
	}
	var turns dto.Metric
	if err := m.Turns.WithLabelValues(wire.OutcomeFailed).Write(&turns); err != nil {
		t.Fatal(err)
	}
	if got := turns.GetCounter().GetValue(); got != 1 {
		t.Errorf("runnerd_turns_total{outcome=failed} = %v", got)
	}
	waitFor(t, "runnerd_leases_held back to 0", 5*time.Second, func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return len(m.leases) == 0
	})
	if got := h.GetHistogram().GetSampleCount(); got != 1 {
		t.Errorf("claim-to-accept samples = %d", got)
	}
}

// A child that accepted and then exited without RESULT gets a report built
// by the daemon from its last PROGRESS facts (R18: a distinct record).
func TestChildExitWithoutResultIsReportedFailed(t *testing.T) {
	c := newCP(t)
	j := c.enqueue("exit")
	r := startDaemon(t, c, nil)
	waitFor(t, "the job to end", 15*time.Second, ended(c, j.ID))
	got := c.job(j.ID)
	// The child's last facts say a container was recorded and nothing was
	// admitted: the daemon abandons, so the conversation stays usable (R29).
	if got.Attempts[0].State != wire.AttemptAbandoned && got.Attempts[0].Outcome != wire.OutcomeFailed {
		t.Fatalf("attempt %s/%s", got.Attempts[0].State, got.Attempts[0].Outcome)
	}
	if c.conversation(j.ConversationID).State != wire.ConversationUsable {
		t.Fatal("conversation not usable after a failure before admission")
	}
	if !strings.Contains(r.logs.String(), `"exit_code":3`) {
		t.Fatalf("no turn_ended record with the exit code:\n%s", r.logs)
	}
	if !strings.Contains(r.logs.String(), `"msg":"agent_turn_failed","job_id":"`+j.ID) || !strings.Contains(r.logs.String(), `"stage":"turn","class":"`+ClassChildExited+`"`) {
		t.Fatalf("no agent_turn_failed record with the daemon's class:\n%s", r.logs)
	}
}

// R33, R37: a child that declines is released (requeued); consecutive
// declines pause claiming and show as launch_error in Admin → Servers; a
// good launch clears it.
func TestR37DeclinesReleaseAndPauseClaims(t *testing.T) {
	c := newCP(t)
	bad := c.enqueue("decline")
	r := startDaemon(t, c, func(cfg *Config) {
		cfg.LaunchFailures = 2
		cfg.LaunchBackoff = 700 * time.Millisecond
		cfg.LaunchBackoffMax = 700 * time.Millisecond
	})
	waitFor(t, "three released attempts", 20*time.Second, func() bool { return len(c.job(bad.ID).Attempts) >= 3 })
	got := c.job(bad.ID)
	for _, a := range got.Attempts[:2] {
		if a.State != wire.AttemptReleased || a.CountsAsAttempt {
			t.Fatalf("attempt %s, counted %v", a.State, a.CountsAsAttempt)
		}
	}
	// The second failure paused claiming: the third claim came at least
	// the backoff (less its jitter) after the second attempt ended.
	gap := got.Attempts[2].ClaimedAt.Sub(*got.Attempts[1].EndedAt)
	if gap < 500*time.Millisecond {
		t.Fatalf("third claim %v after the second release: no launch backoff", gap)
	}
	waitFor(t, "launch_error in Admin → Servers", 5*time.Second, func() bool {
		le := c.server(t, "host-a").LaunchError
		return le != nil && le.Class == "declined:preflight_failed" && le.Consecutive >= 2
	})
	if !r.logs.has(MsgLaunchFailed) || !r.logs.has(MsgTurnReleased) {
		t.Fatal("no launch failure or release record")
	}

	// A good launch clears it.
	if _, err := c.st.CancelJob(context.Background(), bad.ID, c.now()); err != nil {
		t.Fatal(err)
	}
	good := c.enqueue("result")
	waitFor(t, "the good job to end", 15*time.Second, ended(c, good.ID))
	waitFor(t, "launch_error to clear", 5*time.Second, func() bool { return c.server(t, "host-a").LaunchError == nil })
}

// S4, K7: a child that declines for its conversation's own fault (its
// agent command missing) is released, but never counts as a launch
// failure: with claiming set to pause ten minutes after one failure, the
// turns queued behind the broken ones all launch at once on this host; the broken jobs fail past the release cap, their conversations
// usable; no launch_error, no runnerd_launch_failed record, one
// conversation-fault record per decline.
func TestS4ConversationFaultDeclinesNeverPauseClaims(t *testing.T) {
	c := newCP(t)
	var bad, good []wire.Job
	for range 2 {
		bad = append(bad, c.enqueue("decline agent missing"))
		good = append(good, c.enqueue("result"))
	}
	r := startDaemon(t, c, func(cfg *Config) {
		cfg.Capacity = 1
		cfg.LaunchFailures = 1
		cfg.LaunchBackoff = 10 * time.Minute
		cfg.LaunchBackoffMax = 10 * time.Minute
	})
	for _, j := range good {
		waitFor(t, "a launching turn to end", time.Minute, ended(c, j.ID))
		// The fake child's "result" launches (ACCEPT) and reports a
		// scripted failure: launched once, never released.
		if got := c.job(j.ID); len(got.Attempts) != 1 || got.Attempts[0].State != wire.AttemptFinished {
			t.Fatalf("launching turn %s: %s with attempts %+v; want it launched once", j.ID, got.State, got.Attempts)
		}
	}
	for _, j := range bad {
		waitFor(t, "a broken turn to fail past the release cap", time.Minute, ended(c, j.ID))
		got := c.job(j.ID)
		if got.State != wire.JobFailed || !strings.Contains(got.Reason, sandbox.ClassAgentMissing) {
			t.Fatalf("broken turn %s: %s, reason %q; want failed naming %s", j.ID, got.State, got.Reason, sandbox.ClassAgentMissing)
		}
		cv, err := c.st.GetConversation(context.Background(), j.ConversationID)
		if err != nil || cv.State != wire.ConversationUsable {
			t.Fatalf("conversation of a declined turn: %+v, %v; want usable", cv, err)
		}
	}
	if le := c.server(t, "host-a").LaunchError; le != nil {
		t.Fatalf("launch_error %+v after conversation faults only", *le)
	}
	if r.logs.has(MsgLaunchFailed) || !r.logs.has(MsgConversationFault) {
		t.Fatalf("want conversation-fault records and no launch failure:\n%s", r.logs)
	}
}

func (c *cp) server(t *testing.T, name string) wire.Server {
	t.Helper()
	ss, err := c.st.ListServers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range ss {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no server %s", name)
	return wire.Server{}
}

// waitAccepted waits for the child of the job to accept.
func waitAccepted(t *testing.T, r *running) {
	t.Helper()
	waitFor(t, "the child to accept", 15*time.Second, func() bool { return r.logs.has(MsgTurnAccepted) })
}

// R8, R10: when the lease is lost the turn is stopped at once and nothing
// more is written about the attempt.
func TestLeaseLossStopsTurnAndWritesNothing(t *testing.T) {
	c := newCP(t)
	j := c.enqueue("hang")
	r := startDaemon(t, c, nil)
	waitAccepted(t, r)
	c.advance(time.Hour) // the control plane's lease has expired: renewal answers 409
	waitFor(t, "the turn to be stopped", 10*time.Second, func() bool {
		return r.logs.has(MsgTurnEnded) && persisted(r.d) == 0
	})
	if !r.logs.has("agent_lease_lost") {
		t.Fatalf("no lease lost record:\n%s", r.logs)
	}
	a := c.job(j.ID).Attempts[0]
	if a.State != wire.AttemptRunning || a.Outcome != "" {
		t.Fatalf("the daemon wrote about a lost lease: attempt %s/%s", a.State, a.Outcome)
	}
	if r.logs.has(MsgReportSent) {
		t.Fatal("a report was sent after the lease was lost")
	}
}

// R22, R23: when the child's own write was refused for the lease (its
// RESULT says so) while renewal still answered, the daemon sends no report
// about the attempt and stops renewing it.
func TestChildLeaseRejectionSendsNoReport(t *testing.T) {
	c := newCP(t)
	j := c.enqueue("rejected")
	r := startDaemon(t, c, nil)
	waitFor(t, "the attempt to be forgotten", 15*time.Second, func() bool {
		return r.logs.has(MsgTurnEnded) && persisted(r.d) == 0
	})
	waitFor(t, "renewal to stop", 5*time.Second, func() bool { return r.logs.has("agent_heartbeat_stopped") })
	a := c.job(j.ID).Attempts[0]
	if a.State != wire.AttemptRunning || a.Outcome != "" {
		t.Fatalf("the daemon reported after the child's lease rejection: attempt %s/%s", a.State, a.Outcome)
	}
	if r.logs.has(MsgReportSent) || !strings.Contains(r.logs.String(), `"decision":"lease_rejected"`) {
		t.Fatalf("want no report and a lease_rejected decision:\n%s", r.logs)
	}
}

// R13, P7: the user's cancel arrives in a renewal answer; the child gets
// STOP "cancelled" and reports the turn cancelled, and the daemon sends it.
func TestR13CancelStopsTurn(t *testing.T) {
	c := newCP(t)
	j := c.enqueue("stopped")
	r := startDaemon(t, c, nil)
	waitAccepted(t, r)
	if _, err := c.st.CancelJob(context.Background(), j.ID, c.now()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("records:\n%s", r.logs)
		}
	}()
	waitFor(t, "the job to end", 10*time.Second, ended(c, j.ID))
	if got := c.job(j.ID); got.Attempts[0].Outcome != wire.OutcomeCancelled {
		t.Fatalf("attempt outcome %s", got.Attempts[0].Outcome)
	}
	if !r.logs.has("agent_turn_cancelled") {
		t.Fatal("no cancel record")
	}
	if !strings.Contains(r.logs.String(), `"msg":"runnerd_turn_ended","job_id":"`+j.ID+`","attempt_id":"`+c.job(j.ID).Attempts[0].ID+`","outcome":"result"`) {
		t.Fatalf("the cancelled turn's report did not come from the child's RESULT:\n%s", r.logs)
	}
}

// K10, P7: the user's cancel reaches a running turn by the host's cancel
// poll, and by the renewal answer when the control plane has no cancel
// poll (an older release): the job ends cancelled either way, and the
// record says which way it came.
func TestCancelReachesTurnByPollOrRenewal(t *testing.T) {
	for _, tc := range []struct {
		name      string
		noCancels bool
		via       string
	}{
		{"host_poll", false, cancelViaHostPoll},
		{"renewal_fallback", true, cancelViaRenewal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCP(t)
			c.noCancels.Store(tc.noCancels)
			j := c.enqueue("stopped")
			r := startDaemon(t, c, func(cfg *Config) {
				if !tc.noCancels {
					// Renewals far apart: only the poll can be in time.
					cfg.Timings.LeaseTTL, cfg.Timings.Interval = time.Minute, 20*time.Second
				}
			})
			waitAccepted(t, r)
			if _, err := c.st.CancelJob(context.Background(), j.ID, c.now()); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if t.Failed() {
					t.Logf("records:\n%s", r.logs)
				}
			}()
			waitFor(t, "the job to end", 10*time.Second, ended(c, j.ID))
			if got := c.job(j.ID); got.State != wire.JobCancelled {
				t.Fatalf("job %s", got.State)
			}
			if !strings.Contains(r.logs.String(), `"msg":"`+MsgCancelReceived+`","job_id":"`+j.ID+`","attempt_id":"`+c.job(j.ID).Attempts[0].ID+`","via":"`+tc.via+`"`) {
				t.Fatalf("the cancel did not come via %s", tc.via)
			}
			if tc.noCancels && !r.logs.has(MsgCancelPollFailed) {
				t.Fatal("no record of the failing cancel poll")
			}
		})
	}
}

// Drain: claiming stops, the running turn keeps its lease renewed until
// the drain timeout, then it is stopped and reported as worker lost (the
// host ended it): never admitted, so the job is queued again, uncounted.
func TestDrainRenewsThenStopsTurns(t *testing.T) {
	c := newCP(t)
	j := c.enqueue("hang")
	const drain = 1500 * time.Millisecond
	r := startDaemon(t, c, func(cfg *Config) { cfg.DrainTimeout = drain })
	waitAccepted(t, r)
	before := c.job(j.ID).Attempts[0].LeaseExpiresAt
	start := time.Now()
	r.d.Drain()
	r.stopped(t, 15*time.Second)
	if el := time.Since(start); el < drain {
		t.Fatalf("drained in %v, before the drain timeout", el)
	}
	got := c.job(j.ID)
	if !got.Attempts[0].LeaseExpiresAt.After(before) {
		t.Fatal("the lease was not renewed during the drain")
	}
	if got.State != wire.JobQueued || got.WorkerLostCount != 1 || got.AttemptCount != 0 {
		t.Fatalf("job %s, worker lost %d, counted %d", got.State, got.WorkerLostCount, got.AttemptCount)
	}
	for _, msg := range []string{MsgDrainStarted, MsgDrainTimeout, MsgStopped} {
		if !r.logs.has(msg) {
			t.Errorf("no %s record", msg)
		}
	}
	if srv := c.server(t, "host-a"); !srv.Draining || srv.Running != 0 {
		t.Errorf("last host heartbeat: draining %v, running %d", srv.Draining, srv.Running)
	}
}

// The handover (SIGTERM: Run's context ends) leaves the accepted turn
// running and returns within StopGrace: nothing is sent to the child or
// about it, its lease is left as it stands for the next start, its state
// file stays, and the records say how many turns were handed over. (The
// next start's re-attachment needs the daemon's process to have exited, so
// that the child sees EOF: integration's TestSIGTERMHandsTurnOver.)
func TestHandoverLeavesTurnRunning(t *testing.T) {
	c := newCP(t)
	j := c.enqueue("hang")
	r := startDaemon(t, c, func(cfg *Config) { cfg.StopGrace = 2 * time.Second })
	waitAccepted(t, r)
	start := time.Now()
	r.cancel()
	r.stopped(t, 10*time.Second)
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("the handover took %v, want it within StopGrace", el)
	}
	m := regexp.MustCompile(`"msg":"` + MsgTurnHandedOver + `","job_id":"` + j.ID + `","attempt_id":"[^"]+","pid":(\d+)`).FindStringSubmatch(r.logs.String())
	if m == nil {
		t.Fatalf("no %s record for %s:\n%s", MsgTurnHandedOver, j.ID, r.logs.String())
	}
	pid, _ := strconv.Atoi(m[1])
	t.Cleanup(func() { _ = syscall.Kill(-pid, syscall.SIGKILL) }) // its handover ends with it (goleak)
	if !alive(pid) {
		t.Errorf("the handed-over child %d is gone", pid)
	}
	if persisted(r.d) != 1 {
		t.Fatal("the attempt was not kept for the next start")
	}
	if a := c.job(j.ID).Attempts[0]; a.State != wire.AttemptRunning {
		t.Fatalf("attempt %s after the handover", a.State)
	}
	for _, want := range []string{`"msg":"` + MsgHandoverStarted + `","running":1`, `"msg":"` + MsgStopped + `","handover":true,"handed_over":1,"unanswered":0`} {
		if !strings.Contains(r.logs.String(), want) {
			t.Errorf("no %s in the records:\n%s", want, r.logs.String())
		}
	}
	if r.logs.has(MsgTurnStopped) || r.logs.has(MsgReportSent) || r.logs.has(MsgDrainStarted) {
		t.Errorf("the handover stopped or reported the turn, or drained:\n%s", r.logs.String())
	}
	if srv := c.server(t, "host-a"); srv.Draining {
		t.Errorf("a host heartbeat said draining: a handover is no drain")
	}
}

// EndDrain (a second drain request) stops the turns a drain waits for at
// once, without waiting for the drain's timeout, and reports them as the
// timeout does.
func TestEndDrainStopsTurnsNow(t *testing.T) {
	c := newCP(t)
	j := c.enqueue("hang")
	r := startDaemon(t, c, func(cfg *Config) { cfg.DrainTimeout = time.Hour })
	waitAccepted(t, r)
	r.d.Drain()
	waitFor(t, "the drain to begin", 5*time.Second, func() bool { return r.logs.has(MsgDrainStarted) })
	r.d.EndDrain()
	r.stopped(t, 15*time.Second)
	if got := c.job(j.ID); got.State != wire.JobQueued || got.WorkerLostCount != 1 || got.AttemptCount != 0 {
		t.Fatalf("job %s, worker lost %d, counted %d", got.State, got.WorkerLostCount, got.AttemptCount)
	}
	if !r.logs.has(MsgDrainEnded) || r.logs.has(MsgDrainTimeout) {
		t.Errorf("want %s and no %s:\n%s", MsgDrainEnded, MsgDrainTimeout, r.logs.String())
	}
}
