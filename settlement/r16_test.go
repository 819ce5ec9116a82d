package settlement_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/runnerd/runnerd/settlement"
	"github.com/runnerd/runnerd/wire"
)

// errorTexts is every message in err's chain (wrapped and joined) long
// enough to be told apart from a class name.
func errorTexts(err error) []string {
	var out []string
	var walk func(error)
	walk = func(e error) {
		if e == nil {
			return
		}
		if s := e.Error(); len(s) >= 8 {
			out = append(out, s)
		}
		switch u := e.(type) {
		case interface{ Unwrap() []error }:
			for _, x := range u.Unwrap() {
				walk(x)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	walk(err)
	return out
}

// TestR16NoFailureRecordCarriesTheErrorText drives every kind of write of
// an attempt into every kind of failure — a status with a body, a hung
// answer, a lost answer, a refused dial, a refusal of a report, a lease
// rejection — and checks each failure record (agent_control_failure,
// agent_report_retry, agent_turn_failed) against the error the caller got:
// a record carries a class and a status, never the error's text, the
// answer's body, the URL or the token (R16).
func TestR16NoFailureRecordCarriesTheErrorText(t *testing.T) {
	type step func(w *world, c wire.Claim, sess *settlement.Session) error
	ctx := context.Background()
	ref := func(c wire.Claim) wire.AttemptRef {
		return wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}
	}
	admit := func(w *world, c wire.Claim, sess *settlement.Session) error {
		_, err := sess.Admit(ctx, "act-1")
		return err
	}
	tests := []struct {
		name   string
		op     string
		faults []fault
		refuse bool
		run    step
	}{
		{"admission 503", wire.OpAdmission, []fault{status(503), status(503), status(503)}, false, admit},
		{"admission hung", wire.OpAdmission, []fault{hang, hang, hang}, false, admit},
		{"admission lost", wire.OpAdmission, []fault{lose, lose, lose}, false, admit},
		{"admission dial refused", wire.OpAdmission, nil, true, admit},
		{"container 400", wire.OpContainer, []fault{status(400)}, false, func(w *world, c wire.Claim, sess *settlement.Session) error {
			return sess.RecordContainer(ctx, "process", "sb-1")
		}},
		{"notice 500", wire.OpNotices, []fault{status(500), status(500), status(500), status(500), status(500), status(500)}, false, func(w *world, c wire.Claim, sess *settlement.Session) error {
			ag := &agent{activated: "act-1"}
			adm := admitAndPrompt(t, sess, ag)
			if _, err := sess.Settle(ctx, adm, ag.settle); err != nil {
				return err
			}
			return sess.Notify(ctx)
		}},
		{"finish 400", wire.OpFinish, []fault{status(500), status(400)}, false, func(w *world, c wire.Claim, sess *settlement.Session) error {
			_, err := sess.Finish(ctx, settlement.Result{Outcome: wire.OutcomeFailed, Class: "agent_interrupted"})
			return err
		}},
		{"release 409", wire.OpRelease, []fault{status(502), leaseLost}, false, func(w *world, c wire.Claim, sess *settlement.Session) error {
			_, err := sess.Reporter().Send(ctx, settlement.Report{Release: &wire.ReleaseRequest{AttemptRef: ref(c), Class: "declined:x"}})
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newWorld(t)
				c := w.turn("", "hello")
				sess := w.session(c)
				w.in.Plan(tt.op, tt.faults...)
				if tt.refuse {
					w.l.SetRefusing(true)
					w.tr.CloseIdleConnections()
				}
				err := tt.run(w, c, sess)
				if err == nil {
					t.Fatal("the write succeeded; the test needs a failure")
				}
				texts := errorTexts(err)
				if len(texts) == 0 {
					t.Fatalf("no text in %v", err)
				}
				recs := 0
				for _, line := range strings.Split(w.logs.String(), "\n") {
					// No record of the run, whatever its level, names the
					// token, the URL or the path.
					for _, s := range []string{"http://", baseURL, c.WorkerToken, wire.AttemptPath(c.JobID, tt.op)} {
						if strings.Contains(line, s) {
							t.Errorf("record %s carries %q", line, s)
						}
					}
					if !strings.Contains(line, `"level":"WARN"`) && !strings.Contains(line, `"level":"ERROR"`) {
						continue
					}
					recs++
					for _, s := range texts {
						if strings.Contains(line, s) {
							t.Errorf("record %s carries the error's text %q", line, s)
						}
					}
					if strings.Contains(line, "injected") {
						t.Errorf("record %s carries the answer's body", line)
					}
				}
				if recs == 0 || len(w.records("agent_control_failure")) == 0 {
					t.Fatalf("no failure record for %v: %s", err, w.logs.String())
				}
				var se *wire.StatusError
				if errors.As(err, &se) && se.Status == http.StatusBadRequest && wire.Classify(err) != wire.Permanent {
					t.Errorf("a 400 classified %v", wire.Classify(err))
				}
			})
		})
	}
}
