package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/runnerd/runnerd/internal/boottime"
	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// wallOf converts a CLOCK_BOOTTIME instant of this host to wall time: the
// two clocks move together while nothing suspends the machine or steps the
// wall clock, which holds for the length of a test.
func wallOf(i boottime.Instant) time.Time {
	now, bnow := time.Now(), boottime.Now()
	return now.Add(i.Sub(bnow))
}

// silentTurn starts a silent turn whose prompt the agent has and whose lease
// was renewed once, and returns its job, agent and turn child.
func (e *env) silentTurn(title string) (wire.Job, proc, proc) {
	e.t.Helper()
	c := e.conversation(title)
	j := e.send(c.ID, "a long, quiet turn\n!silent 10m")
	e.waitPrompts(c.ID, 1)
	agents, children := e.agents(c.ID), e.turnChildren()
	if len(agents) != 1 || len(children) != 1 {
		e.t.Fatalf("want one agent and one turn child running; got %v and %v", agents, children)
	}
	first := e.job(j.ID).Attempts[0]
	e.waitJob(j.ID, "renewed", func(j wire.Job) bool { return j.Attempts[0].LeaseExpiresAt.After(first.LeaseExpiresAt) })
	return j, agents[0], children[0]
}

// freeze stops p with SIGSTOP and returns once it is stopped; the test's
// cleanup thaws it first, so that the harness can stop it as usual.
func (e *env) freeze(pid int) {
	e.t.Helper()
	e.t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
	if err := fleet.FreezeProcess(pid, waitFor); err != nil {
		e.t.Fatal(err)
	}
}

// K5: the daemon frozen (SIGSTOP) during a silent turn renews nothing and
// stops nothing, yet the agent is gone no later than the lease deadline
// plus the stop grace: the turn child, which got the deadline in its
// payload and after every renewal in a DEADLINE frame, stops its agent
// itself when it passes, and says so (agent_turn_lease_deadline). The
// deadline is never later than the store's lease expiry (R10). Once thawed,
// the daemon writes no report about the attempt; the admitted conversation
// is quarantined as for any lost lease (K13, R30) and the prompt reached the agent once.
func TestFrozenDaemonChildStopsAgentAtDeadline(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	d := e.startDaemon(nil)
	j, agent, child := e.silentTurn("frozen daemon")

	mark := d.Mark()
	frozenAt := time.Now()
	e.freeze(d.Pid())
	agentGone, err := waitGone(agent.Pid, waitFor)
	if err != nil {
		t.Fatalf("the agent outlived the frozen daemon: %v", err)
	}
	lines, err := d.AwaitOutput(mark, regexp.MustCompile(`\{.*"msg":"agent_turn_lease_deadline".*\}`), waitFor)
	if err != nil {
		t.Fatalf("no agent_turn_lease_deadline record from the turn child: %v", err)
	}
	var rec struct {
		Deadline int64  `json:"lease_deadline_ns"`
		JobID    string `json:"job_id"`
	}
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil || rec.JobID != j.ID || rec.Deadline <= 0 {
		t.Fatalf("record %s: %v", lines[0], err)
	}
	deadline := wallOf(boottime.Instant(rec.Deadline))
	t.Logf("daemon frozen at %s; the child's lease deadline %v later; the agent last seen %v and seen gone %v past the deadline (limit: stop grace %v)",
		frozenAt.Format("15:04:05.000"), deadline.Sub(frozenAt), agentGone.LastAlive.Sub(deadline), agentGone.Seen.Sub(deadline), stopGrace)
	if lived := agentGone.LastAlive.Sub(deadline); lived > stopGrace {
		t.Errorf("the agent lived %v past the lease deadline, more than the stop grace %v", lived, stopGrace)
	}
	if early := deadline.Sub(agentGone.Seen); early > 50*time.Millisecond {
		t.Errorf("the agent was stopped %v before the lease deadline", early)
	}
	if childGone, err := waitGone(child.Pid, waitFor); err != nil {
		t.Errorf("the turn child did not end after its deadline: %v", err)
	} else {
		t.Logf("turn child seen gone %v past the deadline", childGone.Seen.Sub(deadline))
	}
	att := e.job(j.ID).Attempts[0]
	if deadline.After(att.LeaseExpiresAt) {
		t.Errorf("the child's deadline %s is later than the store's expiry %s", deadline.Format(time.StampMicro), att.LeaseExpiresAt.Format(time.StampMicro))
	}

	_ = syscall.Kill(d.Pid(), syscall.SIGCONT)
	job := e.waitEnded(j.ID)
	if job.State != wire.JobFailed || len(job.Attempts) != 1 || job.Attempts[0].State != wire.AttemptSuperseded {
		t.Errorf("want the attempt superseded by the reaper and the job failed: %s", describeJob(job))
	}
	if _, ok := findEvent(job, job.Attempts[0].ID, evStaleReport); ok {
		t.Errorf("the thawed daemon tried a report about its lost attempt: %s", describeJob(job))
	}
	e.assertLostPromptOnce(job.ConversationID, "a long, quiet turn\n!silent 10m", job)
}

// K5: with the daemon frozen and its turn child dead (SIGKILL) or frozen
// too (SIGSTOP, its driving connection still open), the supervisor alone is
// left with the agent, and the agent is gone no later than the lease
// deadline the supervisor was given: at once when the child dies (its
// driving connection drops), at the deadline itself when the child is
// frozen (the supervisor's own alarm). The store's expiry bounds that
// deadline (R10).
func TestDeadTurnChildSupervisorStopsAgent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		sig  syscall.Signal
	}{
		{"child killed", syscall.SIGKILL},
		{"child frozen", syscall.SIGSTOP},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, envOpts{})
			d := e.startDaemon(nil)
			j, agent, child := e.silentTurn(tc.name)
			supPid, err := fleet.SupervisorPid(e.stateDir, j.ConversationID)
			if err != nil || !alive(supPid) {
				t.Fatalf("no live supervisor: pid %d, %v", supPid, err)
			}
			e.freeze(d.Pid())
			if tc.sig == syscall.SIGSTOP {
				e.freeze(child.Pid)
			} else if err := syscall.Kill(child.Pid, tc.sig); err != nil {
				t.Fatal(err)
			}
			at := time.Now()
			agentGone, err := waitGone(agent.Pid, waitFor)
			if err != nil {
				t.Fatalf("the agent outlived its turn child: %v", err)
			}
			expiry := e.job(j.ID).Attempts[0].LeaseExpiresAt
			t.Logf("child %s at %s; agent gone %v later, %v relative to the store's lease expiry",
				tc.sig, at.Format("15:04:05.000"), agentGone.Seen.Sub(at), agentGone.Seen.Sub(expiry))
			if agentGone.LastAlive.After(expiry.Add(stopGrace)) {
				t.Errorf("the agent lived %v past the store's lease expiry", agentGone.LastAlive.Sub(expiry))
			}
			if !alive(supPid) {
				t.Error("the supervisor died with the agent; it is retained for the conversation")
			}
		})
	}
}

// K5: a 409, 401, 403 or 404 the turn child itself receives — here on its
// event upload, while renewal goes on undisturbed — stops the agent at
// once, long before any lease could run out: the child stops its agent,
// writes nothing more, and its RESULT tells the daemon the lease is gone, so
// the daemon sends no report and stops renewal (R22). The reaper ends the
// attempt.
func TestChildRefusedWriteStopsAgent(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusConflict, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, envOpts{faults: true})
			e.startDaemon(nil)
			c := e.conversation(fmt.Sprintf("event upload refused with %d", status))
			e.faults.refuse(wire.OpEvents, status)
			// One status event to upload, then ten minutes of sleep.
			j := e.send(c.ID, "a long turn\n!sleep 10m")
			e.waitPrompts(c.ID, 1)
			agents := e.agents(c.ID)
			if len(agents) > 1 {
				t.Fatalf("want at most one agent, got %v", agents)
			}
			var gone fleet.Exit
			if len(agents) == 1 {
				var err error
				if gone, err = waitGone(agents[0].Pid, waitFor); err != nil {
					t.Fatalf("the agent still runs after the child's write was refused: %v", err)
				}
			}
			refused := e.faults.calls(j.ID, wire.OpEvents)
			if len(refused) == 0 {
				t.Fatal("no event upload reached the proxy")
			}
			if !gone.Seen.IsZero() {
				t.Logf("agent seen gone %v after the child's first refused write", gone.Seen.Sub(refused[0].at))
				if after := gone.LastAlive.Sub(refused[0].at); after > leaseTTL {
					t.Errorf("the agent lived %v after the refusal, longer than a lease: it was not stopped at once", after)
				}
			}
			job := e.waitJob(j.ID, "superseded", func(j wire.Job) bool {
				return len(j.Attempts) > 0 && j.Attempts[0].State == wire.AttemptSuperseded
			})
			for _, op := range []string{wire.OpFinish, wire.OpAbandon, wire.OpRelease, wire.OpSettlement} {
				if calls := e.faults.calls(j.ID, op); len(calls) > 0 {
					t.Errorf("%s sent about the attempt whose write was refused: %s", op, describeJob(job))
				}
			}
			if n := len(e.faults.calls(j.ID, wire.OpEvents)); n != 1 {
				t.Errorf("%d event uploads, want the one refused and nothing after it", n)
			}
		})
	}
}

// K5: the supervisor knows the lease deadline from the activation on, not
// only from the first renewal. Daemon and turn child are frozen (SIGSTOP)
// after the agent started and before any renewal was acknowledged — the
// renewal interval is most of a 10 s lease — so the only deadline the
// supervisor can have is the one the activation carried, the payload's:
// the agent is gone by the claim's lease expiry (and the stop grace). A
// supervisor activated without it would leave the agent running.
func TestSupervisorGetsTheLeaseAtActivation(t *testing.T) {
	t.Parallel()
	const ttl = 10 * time.Second
	e := newEnv(t, envOpts{leaseTTL: ttl})
	d := e.startDaemon(func(cfg *fleet.DaemonConfig) {
		cfg.LeaseTTL, cfg.RenewInterval, cfg.RenewTimeout = ttl, 8*time.Second, time.Second
	})
	c := e.conversation("frozen before the first renewal")
	j := e.send(c.ID, "a long, quiet turn\n!silent 10m")
	e.waitPrompts(c.ID, 1)
	agents, children := e.agents(c.ID), e.turnChildren()
	if len(agents) != 1 || len(children) != 1 {
		t.Fatalf("want one agent and one turn child running; got %v and %v", agents, children)
	}
	e.freeze(d.Pid())
	e.freeze(children[0].Pid)
	frozenAt := time.Now()
	att := e.job(j.ID).Attempts[0]
	if renewed := att.LeaseExpiresAt.Sub(att.ClaimedAt); renewed > ttl+time.Second {
		t.Fatalf("a renewal was acknowledged before the freeze (lease expiry %v after the claim): this machine took too long to start the agent for the test to show anything", renewed)
	}
	agentGone, err := waitGone(agents[0].Pid, waitFor)
	if err != nil {
		t.Fatalf("the agent outlived the lease with daemon and child frozen before the first renewal: the supervisor had no deadline from its activation: %v", err)
	}
	t.Logf("frozen %v after the claim; agent gone %v relative to the claim's lease expiry", frozenAt.Sub(att.ClaimedAt), agentGone.Seen.Sub(att.LeaseExpiresAt))
	if agentGone.LastAlive.After(att.LeaseExpiresAt.Add(stopGrace + killGrace)) {
		t.Errorf("the agent lived %v past the claim's lease expiry", agentGone.LastAlive.Sub(att.LeaseExpiresAt))
	}
}
