package integration

import (
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// Event types the control plane records (see controlplane/store).
const (
	evSuperseded  = "attempt_superseded"
	evStaleReport = "lease.stale_report"
)

// TestBlackholedControlPlaneSelfFences black-holes the control plane in
// the middle of a turn whose prompt the agent already has: the proxy
// keeps reading and answers nothing. The daemon cannot renew; once its
// last acknowledged renewal is a whole lease old it stops the turn itself
// (R10, as for a 409: R8) — the agent and the turn child are dead before
// the reaper supersedes the attempt (P3), measured on the store's own
// timestamps. After the black hole is lifted the daemon is back (host
// heartbeats, a new turn runs), yet it writes nothing more about the
// fenced attempt: no event of it is stored after the supersession and no
// stale report is even tried; the admitted conversation is quarantined,
// not LOST (K13), and the prompt reached the agent once (R30, R35). The
// sandbox sweep, running once the control plane answers again, keeps the
// quarantined conversation's sandbox, and its next message resumes the
// same supervisor.
func TestBlackholedControlPlaneSelfFences(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{proxy: true})
	d := e.startDaemon(func(c *fleet.DaemonConfig) { c.Args = append(c.Args, "--sandbox-sweep", sandboxSweep.String()) })

	c := e.conversation("fenced")
	const prompt = "a long, quiet turn\n!silent 10m"
	j := e.send(c.ID, prompt)
	e.waitPrompts(c.ID, 1)
	agents, children := e.agents(c.ID), e.turnChildren()
	if len(agents) != 1 || len(children) != 1 {
		t.Fatalf("want one agent and one turn child running; got %v and %v", agents, children)
	}
	supPid, err := fleet.SupervisorPid(e.stateDir, c.ID)
	if err != nil || !alive(supPid) {
		t.Fatalf("the conversation's supervisor is not running: pid %d, %v", supPid, err)
	}
	// Let one renewal through so that the lease is a renewed one.
	first := e.job(j.ID).Attempts[0]
	e.waitJob(j.ID, "renewed", func(j wire.Job) bool { return j.Attempts[0].LeaseExpiresAt.After(first.LeaseExpiresAt) })

	holedAt := time.Now()
	e.proxy.blackhole(true)
	agentGone, err := waitGone(agents[0].Pid, waitFor)
	if err != nil {
		t.Fatalf("the agent was not stopped: %v", err)
	}
	childGone, err := waitGone(children[0].Pid, waitFor)
	if err != nil {
		t.Fatalf("the turn child was not stopped: %v", err)
	}
	// The agent is gone, so its transcript is final; the sweep cannot
	// remove it yet, as nothing reaches the control plane.
	e.assertPromptsOnce(c.ID, prompt)

	job := e.waitJob(j.ID, "superseded", func(j wire.Job) bool {
		return len(j.Attempts) > 0 && j.Attempts[0].State == wire.AttemptSuperseded
	})
	att := job.Attempts[0]
	sup, ok := findEvent(job, att.ID, evSuperseded)
	if !ok {
		t.Fatalf("no %s event: %s", evSuperseded, describeJob(job))
	}
	t.Logf("black hole at %s; agent gone %v later, turn child %v later; lease expired (store) %v after the black hole; superseded %v after the agent was gone",
		holedAt.Format("15:04:05.000"), agentGone.Seen.Sub(holedAt), childGone.Seen.Sub(holedAt), att.LeaseExpiresAt.Sub(holedAt), sup.Time.Sub(agentGone.Seen))
	if !agentGone.LastAlive.Before(sup.Time) || !childGone.LastAlive.Before(sup.Time) {
		t.Errorf("the turn outlived the attempt: agent alive at %s, child alive at %s, superseded %s",
			agentGone.LastAlive.Format(time.StampMicro), childGone.LastAlive.Format(time.StampMicro), sup.Time.Format(time.StampMicro))
	}
	// R10: the daemon gives the lease up no later than the store's expiry;
	// stopping the turn child then takes at most the stop and kill graces.
	if limit := att.LeaseExpiresAt.Add(stopGrace + killGrace); childGone.LastAlive.After(limit) {
		t.Errorf("the turn child lived %v past the store's lease expiry, more than the stop and kill graces", childGone.LastAlive.Sub(att.LeaseExpiresAt))
	}
	// Not before its lease could have run out: the daemon stopped the turn
	// on its own lease expiry (R10), a whole lease after the send of its
	// last acknowledged renewal — on its own clock, whatever the machine's
	// speed put between that renewal and the black hole.
	re := regexp.MustCompile(`"msg":"agent_lease_expired","job_id":"` + regexp.QuoteMeta(j.ID) + `".*"since_ack_ms":(\d+)`)
	if m := re.FindStringSubmatch(d.Output()); m == nil {
		t.Errorf("no agent_lease_expired record for %s: the turn was stopped for another reason", j.ID)
	} else if ms, _ := strconv.Atoi(m[1]); time.Duration(ms)*time.Millisecond < leaseTTL {
		t.Errorf("the turn was stopped %d ms after its last acknowledged renewal was sent, before its lease of %v could have run out", ms, leaseTTL)
	}

	if !alive(supPid) {
		t.Error("the supervisor was stopped while the control plane could not be asked")
	}
	liftedAt := time.Now()
	e.proxy.blackhole(false)
	e.waitServer("heartbeating after the outage", func(s wire.Server) bool {
		return s.LastHeartbeat != nil && s.LastHeartbeat.After(liftedAt)
	})
	// A new conversation runs: the daemon is fully back, and it had every
	// chance to write about the old attempt.
	c2 := e.conversation("after the outage")
	if j2 := e.waitEnded(e.send(c2.ID, "hello again").ID); j2.State != wire.JobSucceeded {
		t.Fatalf("the turn after the outage: %s", describeJob(j2))
	}

	job = e.job(j.ID)
	for _, ev := range job.Events {
		if ev.AttemptID != att.ID {
			continue
		}
		if ev.Type == evStaleReport && ev.Time.After(holedAt) {
			t.Errorf("the daemon wrote about the fenced attempt after the black hole: %s at %s", ev.Type, ev.Time.Format(time.StampMicro))
		}
		if ev.Source == "runner" && ev.Time.After(sup.Time) {
			t.Errorf("a runner event of the fenced attempt was accepted after the supersession: %s at %s", ev.Type, ev.Time.Format(time.StampMicro))
		}
	}
	if att := job.Attempts[0]; att.State != wire.AttemptSuperseded || att.Outcome != "" && att.Outcome != wire.OutcomeFailed {
		t.Errorf("the fenced attempt changed after the supersession: %s", describeJob(job))
	}
	if job.State != wire.JobFailed || len(job.Attempts) != 1 {
		t.Errorf("the admitted turn must fail without another attempt: %s", describeJob(job))
	}
	// K13: the admitted, unsettled turn quarantined its conversation; the
	// sweep, which asks about it as soon as the control plane answers,
	// keeps its sandbox, and the next message resumes the same supervisor
	// past the interrupted turn (which the agent began: native turn 1).
	e.quarantined(c.ID, j.ID)
	const next = "the message after the outage"
	e.resumes(c.ID, next, supPid, 2)
	e.assertPromptsOnce(c.ID, prompt, next)
}

// sandboxSweep is the sweep period of the daemons that test it.
const sandboxSweep = 200 * time.Millisecond

func findEvent(j wire.Job, attemptID, typ string) (wire.JobEvent, bool) {
	for _, ev := range j.Events {
		if ev.Type == typ && (attemptID == "" || ev.AttemptID == attemptID) {
			return ev, true
		}
	}
	return wire.JobEvent{}, false
}
