package settlement_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/runnerd/runnerd/internal/retry"
	"github.com/runnerd/runnerd/settlement"
	"github.com/runnerd/runnerd/wire"
)

const s = time.Second

// TestReceiptRetryMatrix drives admission and settlement through every kind
// of answer (R24): which answers are retried, how many tries, at which fake
// times, what each failed try records, and what the caller is told.
func TestReceiptRetryMatrix(t *testing.T) {
	type result int
	const (
		ok         result = iota
		ambiguous         // no answer came; it may have committed
		definitive        // the control plane answered no
	)
	rows := []struct {
		name     string
		faults   []fault
		refuse   bool // every dial is refused: the request never leaves
		tries    int
		at       []time.Duration // when each try reached the control plane
		took     time.Duration   // how long the call took
		want     result
		rejected bool     // the answer rejects the lease
		classes  []string // of the agent_control_failure records, in order
	}{
		{name: "200", tries: 1, at: []time.Duration{0}, want: ok},
		{name: "408 then 503 then 200", faults: []fault{status(408), status(503)}, tries: 3,
			at: []time.Duration{0, 5 * s, 10 * s}, took: 10 * s, want: ok, classes: []string{"http_408", "http_503"}},
		{name: "502 three times", faults: []fault{status(502), status(502), status(502)}, tries: 3,
			at: []time.Duration{0, 5 * s, 10 * s}, took: 10 * s, want: ambiguous, classes: []string{"http_502", "http_502", "http_502"}},
		{name: "503 three times", faults: []fault{status(503), status(503), status(503)}, tries: 3,
			at: []time.Duration{0, 5 * s, 10 * s}, took: 10 * s, want: ambiguous, classes: []string{"http_503", "http_503", "http_503"}},
		{name: "504 three times", faults: []fault{status(504), status(504), status(504)}, tries: 3,
			at: []time.Duration{0, 5 * s, 10 * s}, took: 10 * s, want: ambiguous, classes: []string{"http_504", "http_504", "http_504"}},
		{name: "408 three times", faults: []fault{status(408), status(408), status(408)}, tries: 3,
			at: []time.Duration{0, 5 * s, 10 * s}, took: 10 * s, want: ambiguous, classes: []string{"http_408", "http_408", "http_408"}},
		{name: "read timeout three times", faults: []fault{hang, hang, hang}, tries: 3,
			at: []time.Duration{0, 15 * s, 30 * s}, took: 40 * s, want: ambiguous, classes: []string{"timeout", "timeout", "timeout"}},
		{name: "read timeout twice then 200", faults: []fault{hang, hang}, tries: 3,
			at: []time.Duration{0, 15 * s, 30 * s}, took: 30 * s, want: ok, classes: []string{"timeout", "timeout"}},
		{name: "read timeout, 503, then 200", faults: []fault{hang, status(503)}, tries: 3,
			at: []time.Duration{0, 15 * s, 20 * s}, took: 20 * s, want: ok, classes: []string{"timeout", "http_503"}},
		{name: "answer lost once", faults: []fault{lose}, tries: 2,
			at: []time.Duration{0, 5 * s}, took: 5 * s, want: ok, classes: []string{"eof"}},
		{name: "answer lost three times", faults: []fault{lose, lose, lose}, tries: 3,
			at: []time.Duration{0, 5 * s, 10 * s}, took: 10 * s, want: ambiguous, classes: []string{"eof", "eof", "eof"}},
		{name: "connection refused", refuse: true, tries: 3, took: 10 * s, want: definitive,
			classes: []string{"connection_refused", "connection_refused", "connection_refused"}},
		{name: "409", faults: []fault{leaseLost}, tries: 1, at: []time.Duration{0}, want: definitive, rejected: true, classes: []string{"http_409"}},
		{name: "410", faults: []fault{status(410)}, tries: 1, at: []time.Duration{0}, want: definitive, rejected: true, classes: []string{"http_410"}},
		{name: "401", faults: []fault{status(401)}, tries: 1, at: []time.Duration{0}, want: definitive, rejected: true, classes: []string{"http_401"}},
		{name: "403", faults: []fault{status(403)}, tries: 1, at: []time.Duration{0}, want: definitive, rejected: true, classes: []string{"http_403"}},
		{name: "404", faults: []fault{status(404)}, tries: 1, at: []time.Duration{0}, want: definitive, rejected: true, classes: []string{"http_404"}},
		{name: "400", faults: []fault{status(400)}, tries: 1, at: []time.Duration{0}, want: definitive, classes: []string{"http_400"}},
		{name: "500", faults: []fault{status(500)}, tries: 1, at: []time.Duration{0}, want: ambiguous, classes: []string{"http_500"}},
	}
	for _, op := range []string{wire.OpAdmission, wire.OpSettlement} {
		for _, row := range rows {
			t.Run(op+"/"+row.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					w := newWorld(t)
					c := w.turn("", "hello")
					sess := w.session(c)
					ctx := context.Background()
					ag := &agent{activated: "act-1"}
					var adm *settlement.Admission
					if op == wire.OpSettlement {
						var err error
						if adm, err = sess.Admit(ctx, "act-1"); err != nil {
							t.Fatalf("admit: %v", err)
						}
						if _, err := settlement.SendPrompt(ctx, adm, ag.run); err != nil {
							t.Fatalf("send prompt: %v", err)
						}
					}
					w.in.Plan(op, row.faults...)
					if row.refuse {
						w.l.SetRefusing(true)
						w.tr.CloseIdleConnections() // or the claim's connection is reused
					}
					start := time.Now()
					var err error
					if op == wire.OpAdmission {
						adm, err = sess.Admit(ctx, "act-1")
					} else {
						_, err = sess.Settle(ctx, adm, ag.settle)
					}
					if took := time.Since(start); took != row.took {
						t.Errorf("call took %v, want %v", took, row.took)
					}

					var at []time.Duration
					for _, h := range w.in.Hits(op) {
						at = append(at, h.at-start.Sub(w.in.start))
					}
					if !row.refuse && !slices.Equal(at, row.at) {
						t.Errorf("tries reached the control plane at %v, want %v", at, row.at)
					}
					recs := w.records("agent_control_failure")
					var classes []string
					for _, r := range recs {
						if r["op"] != op {
							t.Errorf("record op %v, want %s", r["op"], op)
						}
						classes = append(classes, fmt.Sprint(r["class"]))
						st, _ := r["status"].(float64)
						if strings.HasPrefix(fmt.Sprint(r["class"]), "http_") != (st != 0) {
							t.Errorf("record %v: class and status disagree", r)
						}
					}
					if !slices.Equal(classes, row.classes) {
						t.Errorf("failure records %v, want %v", classes, row.classes)
					}
					if len(recs) != len(row.classes) || (row.want == ok) != (len(recs) == row.tries-1) {
						t.Errorf("%d failure records for %d tries, result %v", len(recs), row.tries, row.want)
					}
					logs := w.logs.String()
					if strings.Contains(logs, c.WorkerToken) || strings.Contains(logs, "http://") || strings.Contains(logs, "injected") {
						t.Errorf("records carry a token, a URL or a body: %s", logs)
					}

					switch row.want {
					case ok:
						if err != nil {
							t.Fatalf("err = %v, want success", err)
						}
					case ambiguous:
						if op == wire.OpAdmission && !errors.Is(err, settlement.ErrAmbiguousAdmission) {
							t.Errorf("err = %v, want ErrAmbiguousAdmission", err)
						}
						if err == nil {
							t.Errorf("err = nil, want a failure")
						}
					case definitive:
						if err == nil || errors.Is(err, settlement.ErrAmbiguousAdmission) {
							t.Errorf("err = %v, want a definitive failure", err)
						}
					}
					if op == wire.OpAdmission {
						if got := sess.Facts().Ambiguous; got != (row.want == ambiguous) {
							t.Errorf("Facts().Ambiguous = %v, want %v", got, row.want == ambiguous)
						}
						if (adm != nil) != (row.want == ok) {
							t.Errorf("admission receipt = %v with err %v", adm, err)
						}
					}
					if sess.Rejected() != row.rejected {
						t.Errorf("Rejected() = %v, want %v", sess.Rejected(), row.rejected)
					}
				})
			})
		}
	}
}

// TestPolicyTryTimeoutAndWaitFromConfig shows that the policy's numbers
// are configuration, not constants: two tries of 2 s with 1 s between.
func TestPolicyTryTimeoutAndWaitFromConfig(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		c := w.turn("", "hello")
		sess := w.session(c, func(cfg *settlement.Config) {
			cfg.Receipts = retry.Policy{Tries: 2, Wait: 1 * s, TryTimeout: 2 * s}
		})
		w.in.Plan(wire.OpAdmission, hang, hang, hang)
		start := time.Now()
		if _, err := sess.Admit(context.Background(), "act-1"); !errors.Is(err, settlement.ErrAmbiguousAdmission) {
			t.Fatalf("admit: %v, want ambiguous", err)
		}
		if took := time.Since(start); took != 5*s {
			t.Errorf("took %v, want 5s (2+1+2)", took)
		}
		if n := len(w.in.Hits(wire.OpAdmission)); n != 2 {
			t.Errorf("%d tries, want 2", n)
		}
	})
}
