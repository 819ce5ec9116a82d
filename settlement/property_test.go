package settlement_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"testing/synctest"

	"pgregory.net/rapid"

	"github.com/runnerd/runnerd/settlement"
	"github.com/runnerd/runnerd/wire"
)

// rejecting reports whether a delivered answer rejects the lease.
func rejecting(h hit) bool {
	switch h.delivered {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusGone:
		return true
	case http.StatusConflict:
		return h.code == wire.CodeLeaseLost
	}
	return false
}

// TestPropertyPromptOnceNoWriteAfterRejection drives a whole turn through
// random sequences of answers — passed to the real handler, lost after the
// commit, hung past the try timeout, 5xx, lease rejections — and a random
// moment of local lease expiry, and checks the invariants:
//   - the prompt is handed over at most once, and only after an admission
//     answer 200 reached the client (R25, R30);
//   - after a rejection, no write about the attempt reaches the control
//     plane (R8, R10, R11, R22, R23);
//   - an admitted job is never queued again, and an ambiguous admission
//     that was reported leaves the conversation LOST (R30).
//
// The turn's calls are sequential (events are queued just before finish),
// so "after" is the order in which the control plane saw the requests.
func TestPropertyPromptOnceNoWriteAfterRejection(t *testing.T) {
	faultKinds := []fault{pass, pass, pass, lose, hang, status(503), status(500), status(408), leaseLost, status(401), status(410)}
	rapid.Check(t, func(rt *rapid.T) {
		faults := rapid.SliceOfN(rapid.SampledFrom(faultKinds), 0, 14).Draw(rt, "faults")
		lostBefore := rapid.IntRange(-1, 8).Draw(rt, "leaseLostBeforeStep")
		container := rapid.Bool().Draw(rt, "container")
		events := rapid.IntRange(0, 4).Draw(rt, "events")
		outcome := rapid.SampledFrom([]string{wire.OutcomeSucceeded, wire.OutcomeFailed}).Draw(rt, "outcome")

		var violations []string
		synctest.Test(t, func(t *testing.T) {
			w := newWorld(t)
			c := w.turn("", "hello")
			sess := w.session(c)
			w.in.mu.Lock()
			w.in.any = append([]fault(nil), faults...)
			w.in.mu.Unlock()
			ctx := context.Background()
			ag := &agent{activated: "act-1"}
			bad := func(format string, args ...any) { violations = append(violations, fmt.Sprintf(format, args...)) }

			localLoss := -1 // hits seen when the owner signalled the loss
			run := func(ctx context.Context, prompt string) (string, error) {
				admitted := false
				for _, h := range w.in.Hits(wire.OpAdmission) {
					admitted = admitted || h.delivered == http.StatusOK
				}
				if !admitted {
					bad("prompt handed over without a received admission answer")
				}
				return ag.run(ctx, prompt)
			}
			var adm *settlement.Admission
			var admErr error
			steps := []func(){
				func() {
					if container {
						sess.RecordContainer(ctx, "process", "sb-1")
					}
				},
				func() { adm, admErr = sess.Admit(ctx, "act-1") },
				func() { settlement.SendPrompt(ctx, adm, run) },
				func() { settlement.SendPrompt(ctx, adm, run) },
				func() { sess.Settle(ctx, adm, ag.settle) },
				func() { sess.Notify(ctx) },
				func() {
					for range events {
						sess.Event("stream", json.RawMessage(`{}`))
					}
				},
				func() { sess.Finish(ctx, settlement.Result{Outcome: outcome}) },
			}
			for i, step := range steps {
				if i == lostBefore {
					sess.LeaseLost()
					localLoss = 0
					for _, h := range w.in.Hits("") {
						if h.attemptID == c.AttemptID {
							localLoss++
						}
					}
				}
				step()
			}
			sess.Close()
			synctest.Wait()

			if n := ag.promptCount(); n > 1 {
				bad("prompt handed over %d times", n)
			}
			if ag.promptCount() == 1 && adm == nil {
				bad("prompt handed over without a receipt (admit error %v)", admErr)
			}
			var hits []hit
			for _, h := range w.in.Hits("") {
				if h.attemptID == c.AttemptID {
					hits = append(hits, h)
				}
			}
			cut := -1
			for i, h := range hits {
				if rejecting(h) {
					cut = i + 1
					if !sess.Rejected() {
						bad("the Session missed the rejection by %s %d %s", h.op, h.delivered, h.code)
					}
					break
				}
			}
			if localLoss >= 0 && (cut < 0 || localLoss < cut) {
				cut = localLoss
			}
			if cut >= 0 && cut < len(hits) {
				bad("%d writes after the rejection, first %s", len(hits)-cut, hits[cut].op)
			}
			j := w.job(c.JobID)
			if j.Admitted && j.State == wire.JobQueued {
				bad("an admitted job was queued again")
			}
			fin := w.in.Hits(wire.OpFinish)
			if errors.Is(admErr, settlement.ErrAmbiguousAdmission) && len(fin) > 0 && fin[len(fin)-1].delivered == http.StatusOK && j.Admitted {
				// Admitted, so never requeued, and never LOST on the missing
				// answer alone: quarantined, the next turn verifies (K13).
				if conv := w.conversation(c.Turn.ConversationID); conv.State != wire.ConversationQuarantined {
					bad("ambiguous admission reported, conversation %s, want quarantined", conv.State)
				}
			}
		})
		for _, v := range violations {
			rt.Error(v)
		}
	})
}
