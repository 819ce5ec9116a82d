package settlement_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/settlement"
	"github.com/runnerd/runnerd/wire"
)

// admitAndPrompt runs a turn up to a sent prompt with no faults.
func admitAndPrompt(t *testing.T, sess *settlement.Session, ag *agent) *settlement.Admission {
	t.Helper()
	ctx := context.Background()
	adm, err := sess.Admit(ctx, ag.activated)
	if err != nil {
		t.Fatalf("admit: %v", err)
	}
	if _, err := settlement.SendPrompt(ctx, adm, ag.run); err != nil {
		t.Fatalf("send prompt: %v", err)
	}
	return adm
}

// writesAfter counts the requests of attemptID that arrived after n hits.
func writesAfter(w *world, attemptID string, n int) []string {
	var ops []string
	for _, h := range w.in.Hits("")[n:] {
		if h.attemptID == attemptID {
			ops = append(ops, h.op)
		}
	}
	return ops
}

// TestAdmissionLostAfterCommit: every try of the admission reaches the
// control plane and commits, and every answer is lost. The turn never
// sends the prompt, asks no more, reports the admission as ambiguous, and
// the control plane, whose own record shows the admission, neither requeues
// the turn (R25, R30) nor loses the conversation on the missing answer: it
// quarantines it, and the next turn verifies the sandbox (K13).
func TestAdmissionLostAfterCommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		c := w.turn("", "hello")
		sess := w.session(c)
		ag := &agent{activated: "act-1"}
		ctx := context.Background()
		w.in.Plan(wire.OpAdmission, lose, lose, lose)

		adm, err := sess.Admit(ctx, "act-1")
		if !errors.Is(err, settlement.ErrAmbiguousAdmission) || adm != nil {
			t.Fatalf("admit = %v, %v; want no receipt and ErrAmbiguousAdmission", adm, err)
		}
		for _, h := range w.in.Hits(wire.OpAdmission) {
			if !h.reached {
				t.Errorf("admission try did not reach the handler")
			}
		}
		if !w.job(c.JobID).Admitted {
			t.Fatalf("the store did not commit the admission; the test proves nothing")
		}
		// Asking again does not ask the control plane: no replay.
		if again, err := sess.Admit(ctx, "act-1"); again != nil || !errors.Is(err, settlement.ErrAmbiguousAdmission) {
			t.Errorf("second Admit = %v, %v", again, err)
		}
		if _, err := settlement.SendPrompt(ctx, adm, ag.run); !errors.Is(err, settlement.ErrNoAdmission) {
			t.Errorf("SendPrompt without a receipt: %v", err)
		}
		if n := len(w.in.Hits(wire.OpAdmission)); n != 3 {
			t.Errorf("%d admission requests, want 3", n)
		}

		if _, err := sess.Finish(ctx, settlement.Result{Outcome: wire.OutcomeFailed, Class: "admission"}); err != nil {
			t.Fatalf("finish: %v", err)
		}
		if ag.promptCount() != 0 {
			t.Errorf("prompt sent %d times, want never", ag.promptCount())
		}
		fin := w.in.Hits(wire.OpFinish)
		if len(fin) != 1 || len(w.in.Hits(wire.OpAbandon)) != 0 {
			t.Fatalf("finish requests %d, abandon %d; want one finish", len(fin), len(w.in.Hits(wire.OpAbandon)))
		}
		var req wire.FinishRequest
		json.Unmarshal(fin[0].body, &req)
		if !req.Ambiguous || req.Outcome != wire.OutcomeFailed {
			t.Errorf("finish request %+v; want failed and admission_ambiguous", req)
		}
		if conv := w.conversation(c.Turn.ConversationID); conv.State != wire.ConversationQuarantined {
			t.Errorf("conversation %s, want quarantined", conv.State)
		}
		if j := w.job(c.JobID); j.State == wire.JobQueued || j.State == wire.JobRunning {
			t.Errorf("job %s, want ended", j.State)
		}
		w.claimNone()
	})
}

// TestAdmissionAnswerLostOnceThenReceipt: the retry of a lost admission
// answer gets the same receipt, and the prompt goes out once (R24, R25).
func TestAdmissionAnswerLostOnceThenReceipt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		c := w.turn("", "hello")
		sess := w.session(c)
		ag := &agent{activated: "act-1"}
		w.in.Plan(wire.OpAdmission, lose)
		adm := admitAndPrompt(t, sess, ag)
		if adm.Receipt().JobID != c.JobID || adm.Receipt().ActivationID != "act-1" {
			t.Errorf("receipt %+v", adm.Receipt())
		}
		if _, err := settlement.SendPrompt(context.Background(), adm, ag.run); !errors.Is(err, settlement.ErrPromptSent) {
			t.Errorf("second SendPrompt: %v, want ErrPromptSent", err)
		}
		if ag.promptCount() != 1 || ag.prompts[0] != "hello" {
			t.Errorf("prompts %q, want exactly [hello]", ag.prompts)
		}
	})
}

// TestPromptGate: without a receipt from Admit, with a forged one, twice,
// or after a lease rejection, the prompt is not handed over (R25).
func TestPromptGate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		ctx := context.Background()
		ag := &agent{activated: "act-1"}
		if _, err := settlement.SendPrompt(ctx, nil, ag.run); !errors.Is(err, settlement.ErrNoAdmission) {
			t.Errorf("nil receipt: %v", err)
		}
		if _, err := settlement.SendPrompt(ctx, &settlement.Admission{}, ag.run); !errors.Is(err, settlement.ErrNoAdmission) {
			t.Errorf("forged receipt: %v", err)
		}

		c := w.turn("", "hello")
		sess := w.session(c)
		adm, err := sess.Admit(ctx, "act-1")
		if err != nil {
			t.Fatal(err)
		}
		copied := *adm
		if _, err := settlement.SendPrompt(ctx, adm, ag.run); err != nil {
			t.Fatal(err)
		}
		if _, err := settlement.SendPrompt(ctx, &copied, ag.run); !errors.Is(err, settlement.ErrPromptSent) {
			t.Errorf("copy of the receipt: %v", err)
		}
		if _, err := settlement.SendPrompt(ctx, adm, ag.run); !errors.Is(err, settlement.ErrPromptSent) {
			t.Errorf("second send: %v", err)
		}

		c2 := w.turn("", "other")
		sess2 := w.session(c2)
		adm2, err := sess2.Admit(ctx, "act-2")
		if err != nil {
			t.Fatal(err)
		}
		sess2.LeaseLost()
		if _, err := settlement.SendPrompt(ctx, adm2, ag.run); !errors.Is(err, settlement.ErrLeaseRejected) {
			t.Errorf("after rejection: %v", err)
		}
		if ag.promptCount() != 1 {
			t.Errorf("prompts %q, want one", ag.prompts)
		}
	})
}

// TestSettlementRepeatedAfterLostAnswer: a settlement whose answer was
// lost is asked again — by the policy's retry, and by calling Settle again
// after every try was lost — and gets the same boundary; the workspace
// epoch moves once (R26, R27).
func TestSettlementRepeatedAfterLostAnswer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		faults []fault
	}{
		{"retry within the policy", []fault{lose}},
		{"Settle called again", []fault{lose, lose, lose}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newWorld(t)
				c := w.turn("", "hello")
				sess := w.session(c)
				ag := &agent{activated: "act-1"}
				adm := admitAndPrompt(t, sess, ag)
				ctx := context.Background()
				w.in.Plan(wire.OpSettlement, tc.faults...)

				b, err := sess.Settle(ctx, adm, ag.settle)
				if len(tc.faults) == 3 {
					if err == nil {
						t.Fatalf("settle succeeded with every answer lost")
					}
					if w.conversation(c.Turn.ConversationID).Epoch != c.Turn.Epoch+1 {
						t.Fatalf("the lost settlement did not commit; the test proves nothing")
					}
					b, err = sess.Settle(ctx, adm, ag.settle)
				}
				if err != nil {
					t.Fatalf("settle: %v", err)
				}
				conv := w.conversation(c.Turn.ConversationID)
				if b.WorkspaceEpoch != c.Turn.Epoch+1 || conv.Epoch != b.WorkspaceEpoch || conv.NativeTurn != b.NativeTurn {
					t.Errorf("boundary %+v, conversation epoch %d native turn %d, turn began at epoch %d",
						b, conv.Epoch, conv.NativeTurn, c.Turn.Epoch)
				}
				for _, h := range w.in.Hits(wire.OpSettlement) {
					if !h.reached {
						t.Errorf("a settlement try did not reach the handler")
					}
				}
				// A settled Session answers from memory.
				n := len(w.in.Hits(wire.OpSettlement))
				again, err := sess.Settle(ctx, adm, ag.settle)
				if err != nil || again != b || len(w.in.Hits(wire.OpSettlement)) != n {
					t.Errorf("settle again = %+v, %v after %d requests", again, err, len(w.in.Hits(wire.OpSettlement))-n)
				}
				if _, err := sess.Finish(ctx, settlement.Result{Outcome: wire.OutcomeSucceeded}); err != nil {
					t.Fatalf("finish: %v", err)
				}
				if j := w.job(c.JobID); j.State != wire.JobSucceeded {
					t.Errorf("job %s, want succeeded", j.State)
				}
				if conv := w.conversation(c.Turn.ConversationID); conv.Epoch != b.WorkspaceEpoch || conv.State != wire.ConversationUsable {
					t.Errorf("after finish: epoch %d state %s", conv.Epoch, conv.State)
				}
			})
		})
	}
}

// TestSupervisorUnconfirmedFailsClosed: a supervisor that restarted and no
// longer knows the activation cannot confirm the turn; the settlement is
// never sent, and a success report becomes a failure, so the conversation
// is quarantined (K13: its next turn verifies the sandbox) rather than
// assumed settled (R28).
func TestSupervisorUnconfirmedFailsClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		c := w.turn("", "hello")
		sess := w.session(c)
		ag := &agent{activated: "act-1"}
		adm := admitAndPrompt(t, sess, ag)
		ctx := context.Background()
		ag.forgot = true
		if _, err := sess.Settle(ctx, adm, ag.settle); !errors.Is(err, settlement.ErrUnconfirmed) {
			t.Fatalf("settle: %v, want ErrUnconfirmed", err)
		}
		wrong := func(context.Context) (wire.SupervisorReceipt, error) {
			return wire.SupervisorReceipt{ActivationID: "act-0", ReceiptID: "old"}, nil
		}
		if _, err := sess.Settle(ctx, adm, wrong); !errors.Is(err, settlement.ErrUnconfirmed) {
			t.Fatalf("settle with another activation's receipt: %v, want ErrUnconfirmed", err)
		}
		if n := len(w.in.Hits(wire.OpSettlement)); n != 0 {
			t.Errorf("%d settlement requests, want none", n)
		}
		if err := sess.Notify(ctx); !errors.Is(err, settlement.ErrNotSettled) {
			t.Errorf("notify before settlement: %v", err)
		}
		if _, err := sess.Finish(ctx, settlement.Result{Outcome: wire.OutcomeSucceeded}); err != nil {
			t.Fatalf("finish: %v", err)
		}
		var req wire.FinishRequest
		json.Unmarshal(w.in.Hits(wire.OpFinish)[0].body, &req)
		if req.Outcome != wire.OutcomeFailed || req.Class != settlement.ClassUnsettled {
			t.Errorf("finish %+v, want failed/unsettled", req)
		}
		if conv := w.conversation(c.Turn.ConversationID); conv.State != wire.ConversationQuarantined {
			t.Errorf("conversation %s, want quarantined", conv.State)
		}
	})
}

// TestNoticeFailureStillSucceeds: with supervisor and control-plane
// settlement done, a notice that cannot be delivered is retried under the
// report policy for at most a lease (K1: 5 s, doubling), recorded once with
// a retry record per pause, and the turn still reports success (R23).
func TestNoticeFailureStillSucceeds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		c := w.turn("", "hello")
		sess := w.session(c)
		ag := &agent{activated: "act-1"}
		adm := admitAndPrompt(t, sess, ag)
		ctx := context.Background()
		if _, err := sess.Settle(ctx, adm, ag.settle); err != nil {
			t.Fatal(err)
		}
		w.in.Always(wire.OpNotices, status(503))
		start := time.Now()
		if err := sess.Notify(ctx); err == nil {
			t.Fatalf("notify succeeded through a 503")
		}
		var at []time.Duration
		for _, h := range w.in.Hits(wire.OpNotices) {
			at = append(at, h.at-start.Sub(w.in.start))
		}
		if want := []time.Duration{0, 5 * s, 15 * s, 35 * s, 75 * s}; !slices.Equal(at, want) {
			t.Errorf("notice tries at %v, want %v (the next pause would pass the lease)", at, want)
		}
		if took := time.Since(start); took != 75*s {
			t.Errorf("notify took %v, want 75s", took)
		}
		recs := w.records("agent_control_failure")
		if len(recs) != 1 || recs[0]["op"] != wire.OpNotices || recs[0]["status"] != float64(503) {
			t.Errorf("records %v, want one notice failure with status 503", recs)
		}
		if n := len(w.records(settlement.MsgReportRetry)); n != 4 {
			t.Errorf("%d retry records, want 4", n)
		}
		if _, err := sess.Finish(ctx, settlement.Result{Outcome: wire.OutcomeSucceeded}); err != nil {
			t.Fatalf("finish: %v", err)
		}
		if j := w.job(c.JobID); j.State != wire.JobSucceeded {
			t.Errorf("job %s, want succeeded", j.State)
		}
		if conv := w.conversation(c.Turn.ConversationID); conv.State != wire.ConversationUsable {
			t.Errorf("conversation %s, want usable", conv.State)
		}
	})
}

// TestFinishWhileEventUploadDown: event upload hangs for the whole turn;
// the turn is never blocked by it, and finish still reaches the control
// plane within the flush bound and is recorded (R21).
func TestFinishWhileEventUploadDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		w.in.Always(wire.OpEvents, hang)
		c := w.turn("", "hello")
		sess := w.session(c, func(cfg *settlement.Config) { cfg.Events.Buffer = 8 })
		ag := &agent{activated: "act-1"}
		ctx := context.Background()
		start := time.Now()
		for i := range 20 {
			sess.Event("stream", json.RawMessage(`{"n":`+string(rune('0'+i%10))+`}`))
		}
		if time.Since(start) != 0 {
			t.Errorf("queueing events took %v of fake time", time.Since(start))
		}
		adm := admitAndPrompt(t, sess, ag)
		if _, err := sess.Settle(ctx, adm, ag.settle); err != nil {
			t.Fatal(err)
		}
		if err := sess.Notify(ctx); err != nil {
			t.Fatal(err)
		}
		begin := time.Now()
		if _, err := sess.Finish(ctx, settlement.Result{Outcome: wire.OutcomeSucceeded}); err != nil {
			t.Fatalf("finish: %v", err)
		}
		if took := time.Since(begin); took > settlement.DefaultEventFlush {
			t.Errorf("finish waited %v for events, more than the flush bound", took)
		}
		if j := w.job(c.JobID); j.State != wire.JobSucceeded {
			t.Errorf("job %s, want succeeded", j.State)
		}
		if len(w.in.Hits(wire.OpEvents)) == 0 {
			t.Errorf("no event upload was tried")
		}
		for _, h := range w.in.Hits(wire.OpEvents) {
			if h.reached {
				t.Errorf("an event upload reached the handler")
			}
		}
		drops := w.records(diagnostics.MsgEventsDropped)
		if len(drops) != 2 || drops[0]["dropped"] != float64(1) || drops[1]["dropped"] != float64(20) {
			t.Errorf("drop records %v, want the first drop and a total of 20 (12 refused, 8 never uploaded)", drops)
		}
		if err := sess.Close(); !errors.Is(err, settlement.ErrEventsDropped) || !strings.Contains(err.Error(), "20 never reached") {
			t.Errorf("Close: %v, want ErrEventsDropped counting 20", err)
		}
		if recs := w.records("agent_control_failure"); len(recs) != 1 || recs[0]["op"] != wire.OpEvents {
			t.Errorf("records %v, want one events failure for the whole outage", recs)
		}
	})
}

// TestEventsUploadedInSequence: events reach the control plane in batches
// with increasing sequence numbers; a batch repeated after a lost answer
// stores nothing twice.
func TestEventsUploadedInSequence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		c := w.turn("", "hello")
		sess := w.session(c, func(cfg *settlement.Config) { cfg.Events.Batch = 3 })
		w.in.Plan(wire.OpEvents, lose)
		for range 7 {
			sess.Event("stream", json.RawMessage(`{}`))
		}
		synctest.Wait()
		time.Sleep(6 * s) // past the retry wait after the lost answer
		synctest.Wait()
		var runner []wire.JobEvent
		for _, e := range w.job(c.JobID).Events {
			if e.Source == "runner" {
				runner = append(runner, e)
			}
		}
		if len(runner) != 7 {
			t.Fatalf("%d runner events stored, want 7: %+v", len(runner), runner)
		}
		seen := map[int64]bool{}
		for _, h := range w.in.Hits(wire.OpEvents) {
			var req wire.EventsRequest
			json.Unmarshal(h.body, &req)
			if len(req.Events) > 3 {
				t.Errorf("batch of %d, want at most 3", len(req.Events))
			}
			for i, e := range req.Events {
				if e.Seq != req.Events[0].Seq+int64(i) {
					t.Errorf("batch sequence numbers not contiguous: %+v", req.Events)
				}
				seen[e.Seq] = true
			}
		}
		for seq := int64(1); seq <= 7; seq++ {
			if !seen[seq] {
				t.Errorf("sequence number %d never uploaded", seq)
			}
		}
		if len(seen) != 7 {
			t.Errorf("uploaded sequence numbers %v, want 1..7", seen)
		}
		if err := sess.Close(); err != nil {
			t.Errorf("Close after every event was stored: %v", err)
		}
	})
}

// TestLeaseRejectedMidTurn: after the control plane refuses the lease (its
// real 409 once the lease expired) or the owner signals a local expiry,
// no further write about the attempt reaches the handler: not events, not
// settlement, not the notice, not finish or abandon (R8, R10, R11, R22, R23).
func TestLeaseRejectedMidTurn(t *testing.T) {
	for _, tc := range []struct {
		name   string
		reject func(w *world, sess *settlement.Session)
	}{
		{"409 from the control plane", func(w *world, sess *settlement.Session) {
			time.Sleep(121 * s) // the 120 s lease runs out: nobody renews it here
			sess.Event("stream", json.RawMessage(`{}`))
			synctest.Wait()
			hits := w.in.Hits(wire.OpEvents)
			if len(hits) != 1 || hits[0].delivered != 409 {
				w.t.Fatalf("event upload after expiry: %+v, want one real 409", hits)
			}
		}},
		{"local expiry signalled by the owner", func(w *world, sess *settlement.Session) {
			sess.LeaseLost()
		}},
		{"401 on a call", func(w *world, sess *settlement.Session) {
			w.in.Plan(wire.OpEvents, status(401))
			sess.Event("stream", json.RawMessage(`{}`))
			synctest.Wait()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newWorld(t)
				c := w.turn("", "hello")
				sess := w.session(c)
				ag := &agent{activated: "act-1"}
				ctx := context.Background()
				if err := sess.RecordContainer(ctx, "process", "sb-1"); err != nil {
					t.Fatal(err)
				}
				adm := admitAndPrompt(t, sess, ag)
				tc.reject(w, sess)
				if !sess.Rejected() {
					t.Fatalf("the Session did not see the rejection")
				}
				n := len(w.in.Hits(""))

				sess.Event("stream", json.RawMessage(`{}`))
				if _, err := sess.Settle(ctx, adm, ag.settle); !errors.Is(err, settlement.ErrLeaseRejected) {
					t.Errorf("settle: %v", err)
				}
				if err := sess.Notify(ctx); err == nil {
					t.Errorf("notify succeeded")
				}
				if _, err := sess.Finish(ctx, settlement.Result{Outcome: wire.OutcomeFailed}); !errors.Is(err, settlement.ErrLeaseRejected) {
					t.Errorf("finish: %v", err)
				}
				if err := sess.RecordContainer(ctx, "process", "sb-1"); !errors.Is(err, settlement.ErrLeaseRejected) {
					t.Errorf("record container: %v", err)
				}
				sess.Close()
				synctest.Wait()
				if ops := writesAfter(w, c.AttemptID, n); len(ops) != 0 {
					t.Errorf("writes after the rejection: %v", ops)
				}
				if ag.settles != 0 {
					t.Errorf("the supervisor was asked to settle after the rejection")
				}
				if len(w.records(diagnostics.MsgTurnFailed)) == 0 {
					t.Errorf("no agent_turn_failed record")
				}
			})
		})
	}
}

// TestAbandonBeforeAdmission: a preparation failure before admission with
// a recorded container abandons the activation and leaves the conversation
// usable for its next message; without a recorded container it is a plain
// failure. Event upload being down gates neither (R29).
func TestAbandonBeforeAdmission(t *testing.T) {
	for _, tc := range []struct {
		name      string
		container bool
		attempt   string
	}{
		{"with a recorded container", true, wire.AttemptAbandoned},
		{"without a recorded container", false, wire.AttemptFinished},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newWorld(t)
				w.in.Always(wire.OpEvents, hang)
				c := w.turn("", "hello")
				sess := w.session(c)
				ctx := context.Background()
				sess.Event("error", json.RawMessage(`{"stage":"activation"}`))
				if tc.container {
					if err := sess.RecordContainer(ctx, "docker", "c0ffee"); err != nil {
						t.Fatal(err)
					}
				}
				// The first answer is lost: the repeated report gets the first one's answer (P2).
				w.in.Plan(wire.OpAbandon, lose)
				w.in.Plan(wire.OpFinish, lose)
				if _, err := sess.Finish(ctx, settlement.Result{Class: "activation_failed"}); err != nil {
					t.Fatalf("report: %v", err)
				}
				abandons, finishes := len(w.in.Hits(wire.OpAbandon)), len(w.in.Hits(wire.OpFinish))
				if tc.container && (abandons != 2 || finishes != 0) || !tc.container && (abandons != 0 || finishes != 2) {
					t.Errorf("abandon %d, finish %d", abandons, finishes)
				}
				j := w.job(c.JobID)
				if j.State != wire.JobFailed || len(j.Attempts) != 1 || j.Attempts[0].State != tc.attempt {
					t.Errorf("job %s, attempts %+v; want failed with one %s attempt", j.State, j.Attempts, tc.attempt)
				}
				if conv := w.conversation(c.Turn.ConversationID); conv.State != wire.ConversationUsable {
					t.Errorf("conversation %s, want usable", conv.State)
				}
				// The next message resumes the conversation.
				next := w.turn(c.Turn.ConversationID, "again")
				if next.Turn.ConversationID != c.Turn.ConversationID {
					t.Errorf("next claim is for %s", next.Turn.ConversationID)
				}
			})
		})
	}
}

// TestFinishTwiceSameAnswer: the terminal report is sent once; asking
// again returns the recorded answer without a request.
func TestFinishTwiceSameAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		c := w.turn("", "hello")
		sess := w.session(c)
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // a terminal report is owed even when the turn's context is done
		a, err := sess.Finish(ctx, settlement.Result{Outcome: wire.OutcomeCancelled})
		if err != nil {
			t.Fatal(err)
		}
		b, err := sess.Finish(ctx, settlement.Result{Outcome: wire.OutcomeFailed})
		if err != nil || a != b || len(w.in.Hits(wire.OpFinish)) != 1 {
			t.Errorf("second finish %+v, %v; %d requests", b, err, len(w.in.Hits(wire.OpFinish)))
		}
		if j := w.job(c.JobID); j.State != wire.JobCancelled {
			t.Errorf("job %s", j.State)
		}
	})
}

// TestAdmitCancelledBeforeSendingIsNotAmbiguous: an admission that was
// never sent cannot have committed; it is a plain failure, not ambiguous.
func TestAdmitCancelledBeforeSendingIsNotAmbiguous(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		c := w.turn("", "hello")
		sess := w.session(c)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := sess.Admit(ctx, "act-1"); err == nil || errors.Is(err, settlement.ErrAmbiguousAdmission) {
			t.Errorf("admit: %v, want a plain failure", err)
		}
		if sess.Facts().Ambiguous || len(w.in.Hits(wire.OpAdmission)) != 0 {
			t.Errorf("facts %+v, %d admission requests", sess.Facts(), len(w.in.Hits(wire.OpAdmission)))
		}
	})
}

// TestReleaseUnderThePolicy: a release goes through the report policy (a
// lost answer is asked again and repeats harmlessly) and requeues the
// turn; after admission the control plane refuses it (R33, R36), and the
// Reporter fails the turn instead of requeueing it.
func TestReleaseUnderThePolicy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		ctx := context.Background()
		c := w.turn("", "hello")
		sess := w.session(c)
		w.in.Plan(wire.OpRelease, lose)
		rel := func(c wire.Claim, class string) settlement.Report {
			return settlement.Report{Release: &wire.ReleaseRequest{AttemptRef: wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}, Class: class}}
		}
		if resp, err := sess.Reporter().Send(ctx, rel(c, "declined:image_missing")); err != nil || resp.JobState != wire.JobQueued {
			t.Fatalf("release: %v", err)
		}
		if n := len(w.in.Hits(wire.OpRelease)); n != 2 {
			t.Errorf("%d release requests, want 2", n)
		}
		if j := w.job(c.JobID); j.State != wire.JobQueued || j.Attempts[0].State != wire.AttemptReleased {
			t.Errorf("job %s, attempt %s; want queued and released", j.State, j.Attempts[0].State)
		}

		again, err := w.wc.Claim(ctx, w.hostToken, wire.ClaimRequest{})
		if err != nil || again.JobID != c.JobID {
			t.Fatalf("claim again: %+v, %v", again, err)
		}
		sess2 := w.session(again)
		if _, err := sess2.Admit(ctx, "act-2"); err != nil {
			t.Fatal(err)
		}
		resp, err := sess2.Reporter().Send(ctx, rel(again, "declined:late"))
		if err != nil || resp.JobState != wire.JobFailed || sess2.Rejected() {
			t.Errorf("release after admission: %+v, %v (rejected %v), want the turn failed", resp, err, sess2.Rejected())
		}
		if h := w.in.Hits(wire.OpRelease); len(h) != 3 || h[2].code != wire.CodeAdmitted {
			t.Errorf("release requests %+v, want the third refused 409 admitted", h)
		}
		if j := w.job(c.JobID); j.State != wire.JobFailed {
			t.Errorf("job %s, want failed, never queued again", j.State)
		}
	})
}

// TestReaperBackstopWhenEventsAndFinishDown: with event upload and finish
// both unavailable, the finish keeps trying (K1) until the owner fences
// the attempt — as the renewer does once the lease can no longer be valid
// (R10) — and the control plane's reaper ends the attempt once its lease
// is past: the admitted, unsettled turn leaves the conversation
// quarantined (K13), not LOST, and is not queued again (R21, R30).
func TestReaperBackstopWhenEventsAndFinishDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		w.in.Always(wire.OpEvents, status(503))
		w.in.Always(wire.OpFinish, hang)
		c := w.turn("", "hello")
		sess := w.session(c)
		ag := &agent{activated: "act-1"}
		admitAndPrompt(t, sess, ag)
		sess.Event("error", json.RawMessage(`{"class":"agent_interrupted"}`))
		ctx := context.Background()
		finished := make(chan error, 1)
		go func() {
			_, err := sess.Finish(ctx, settlement.Result{Class: "agent_interrupted"})
			finished <- err
		}()
		time.Sleep(3 * time.Minute) // past the lease and the reaper's grace
		if n := len(w.in.Hits(wire.OpFinish)); n < 4 {
			t.Errorf("%d finish tries in 3 minutes, want more than R24's three", n)
		}
		if j := w.job(c.JobID); j.State != wire.JobRunning {
			t.Fatalf("job %s before the reaper, want running", j.State)
		}
		sess.LeaseLost()
		if err := <-finished; !errors.Is(err, settlement.ErrLeaseRejected) {
			t.Fatalf("finish after the fence: %v, want ErrLeaseRejected", err)
		}
		if _, err := w.st.Reap(ctx, store.ReapParams{Now: time.Now(), Grace: 30 * time.Second}); err != nil {
			t.Fatal(err)
		}
		j := w.job(c.JobID)
		if j.State == wire.JobQueued || j.State == wire.JobRunning || j.Attempts[0].State != wire.AttemptSuperseded {
			t.Errorf("job %s, attempt %s; want ended and superseded", j.State, j.Attempts[0].State)
		}
		if conv := w.conversation(c.Turn.ConversationID); conv.State != wire.ConversationQuarantined {
			t.Errorf("conversation %s, want quarantined", conv.State)
		}
		w.claimNone()
	})
}
