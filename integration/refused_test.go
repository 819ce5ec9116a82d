package integration

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// TestRenewalRefusedStopsTurn has the control plane's answer to a renewal
// replaced by 409 (the lease is gone, R8) or by 401, 403 or 404 (the
// worker credential is refused, R11) while the agent works on an admitted
// prompt. The daemon stops the turn at once — the agent is gone before
// the lease it still held could have run out — and never retries: no
// renewal of that job follows the refused one, and nothing more is written
// about the attempt (no events, no finish; the store records no stale
// report). The reaper ends the attempt; the conversation is quarantined
// (K13), never replayed (R30).
func TestRenewalRefusedStopsTurn(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusConflict, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, envOpts{faults: true})
			e.startDaemon(nil)
			c := e.conversation(fmt.Sprintf("renewal refused with %d", status))
			const prompt = "a long turn\n!silent 10m"
			j := e.send(c.ID, prompt)
			e.waitPrompts(c.ID, 1)
			agents := e.agents(c.ID)
			if len(agents) != 1 {
				t.Fatalf("want one agent, got %v", agents)
			}

			refusedAt := time.Now()
			e.faults.refuse(wire.OpRenew, status)
			gone, err := waitGone(agents[0].Pid, waitFor)
			if err != nil {
				t.Fatalf("the agent still runs after the renewal was refused: %v", err)
			}
			job := e.waitJob(j.ID, "superseded", func(j wire.Job) bool {
				return len(j.Attempts) > 0 && j.Attempts[0].State == wire.AttemptSuperseded
			})
			att := job.Attempts[0]
			renewals := e.faults.calls(j.ID, wire.OpRenew)
			var firstRefused time.Time
			n := 0
			for _, r := range renewals {
				if r.refused {
					n++
					if firstRefused.IsZero() {
						firstRefused = r.at
					}
				}
			}
			t.Logf("renewal refused %v after the switch; agent gone %v after that; the store's lease ran until %v after it",
				firstRefused.Sub(refusedAt), gone.Seen.Sub(firstRefused), att.LeaseExpiresAt.Sub(firstRefused))
			if n != 1 {
				t.Errorf("the daemon sent %d renewals after the first %d, want exactly one and no retry", n, status)
			}
			if !gone.LastAlive.Before(att.LeaseExpiresAt) {
				t.Errorf("the agent lived until %s, when the lease ran out (%s): not stopped on the %d",
					gone.LastAlive.Format(time.StampMilli), att.LeaseExpiresAt.Format(time.StampMilli), status)
			}
			for _, op := range []string{wire.OpFinish, wire.OpAbandon, wire.OpRelease, wire.OpSettlement} {
				if calls := e.faults.calls(j.ID, op); len(calls) > 0 {
					t.Errorf("the daemon sent %s about the refused attempt", op)
				}
			}
			for _, call := range e.faults.calls(j.ID, wire.OpEvents) {
				if call.at.After(gone.Seen) {
					t.Errorf("an event upload about the refused attempt at %s, after the turn stopped", call.at.Format(time.StampMilli))
				}
			}
			if _, stale := findEvent(job, att.ID, evStaleReport); stale {
				t.Errorf("a stale report reached the store: %s", describeJob(job))
			}
			if job.State != wire.JobFailed {
				t.Errorf("job: %s", describeJob(job))
			}
			// K13: admitted and unsettled, so quarantined, not lost.
			if conv := e.conv(c.ID); conv.State != wire.ConversationQuarantined {
				t.Errorf("conversation is %s, want quarantined", conv.State)
			}
			e.assertPromptsOnce(c.ID, prompt)
		})
	}
}
