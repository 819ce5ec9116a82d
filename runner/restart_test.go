package runner

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/settlement"
	"github.com/runnerd/runnerd/wire"
)

// removals is a sandbox.Backend that only records Remove: the daemon uses
// nothing else of its backend.
type removals struct {
	mu    sync.Mutex
	convs []string
}

func (r *removals) Name() string                                  { return sandbox.BackendProcess }
func (r *removals) Preflight(context.Context, sandbox.Spec) error { return nil }
func (r *removals) Ensure(context.Context, sandbox.Spec) (sandbox.Sandbox, error) {
	return sandbox.Sandbox{}, nil
}
func (r *removals) Remove(_ context.Context, conv string) error {
	r.mu.Lock()
	r.convs = append(r.convs, conv)
	r.mu.Unlock()
	return nil
}
func (r *removals) removed() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.convs)
}

func newTestDaemon(t *testing.T, c *cp, mod func(*Config)) (*Daemon, *logBuf) {
	t.Helper()
	logs := &logBuf{}
	cfg := Config{
		ControlPlaneURL:       c.url,
		HostToken:             c.hostToken,
		HostName:              "host-a",
		StateDir:              t.TempDir(),
		Executable:            "/bin/false",
		Timings:               testTimings,
		ClaimWait:             500 * time.Millisecond,
		ClaimBackoff:          50 * time.Millisecond,
		HostHeartbeatInterval: 200 * time.Millisecond,
		ControlTimeout:        5 * time.Second,
		StopGrace:             500 * time.Millisecond,
		KillGrace:             500 * time.Millisecond,
		DrainTimeout:          5 * time.Second,
		LaunchBackoff:         300 * time.Millisecond,
		LaunchBackoffMax:      300 * time.Millisecond,
		Logger:                slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	cfg.Receipts.Wait = 100 * time.Millisecond
	cfg.Receipts.TryTimeout = 5 * time.Second
	cfg.Reports.Wait = 100 * time.Millisecond
	cfg.Reports.TryTimeout = 5 * time.Second
	if mod != nil {
		mod(&cfg)
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d, logs
}

// P5, P6, R31, P2: at start every persisted attempt is resolved by asking
// the real control plane first (a renewal with the attempt's own token).
// A persisted report is re-sent; no report with the lease alive finishes as
// worker_lost (never admitted: requeued without counting an attempt;
// admitted: the conversation is LOST and its sandbox removed); a rejected
// lease gets nothing written, not even a persisted report.
func TestP6RestartDecisions(t *testing.T) {
	tests := []struct {
		name     string
		admit    bool
		report   bool          // a terminal report was persisted
		finished bool          // the attempt was already finished by the earlier run
		expire   time.Duration // move the control plane's clock past the lease
		decision string
		check    func(t *testing.T, c *cp, j wire.Job, conv wire.Conversation, removed []string)
	}{
		{
			name: "persisted report is resent", report: true, decision: decisionResent,
			check: func(t *testing.T, c *cp, j wire.Job, conv wire.Conversation, removed []string) {
				if j.State != wire.JobFailed || j.Attempts[0].State != wire.AttemptFinished || j.Attempts[0].Outcome != wire.OutcomeFailed {
					t.Fatalf("job %s/%s, attempt %s/%s", j.State, j.Outcome, j.Attempts[0].State, j.Attempts[0].Outcome)
				}
			},
		},
		{
			name: "no report, lease alive, never admitted: worker lost, requeued, not counted", decision: decisionWorkerLost,
			check: func(t *testing.T, c *cp, j wire.Job, conv wire.Conversation, removed []string) {
				if j.State != wire.JobQueued || j.AttemptCount != 0 || j.WorkerLostCount != 1 || j.Attempts[0].CountsAsAttempt || j.Cause != "" {
					t.Fatalf("job %s, attempts counted %d, worker lost %d, counts %v, cause %q", j.State, j.AttemptCount, j.WorkerLostCount, j.Attempts[0].CountsAsAttempt, j.Cause)
				}
				if conv.State != wire.ConversationUsable || len(removed) != 0 {
					t.Fatalf("conversation %s, removed %v", conv.State, removed)
				}
			},
		},
		{
			name: "no report, lease alive, admitted: conversation quarantined, sandbox kept", admit: true, decision: decisionWorkerLost,
			check: func(t *testing.T, c *cp, j wire.Job, conv wire.Conversation, removed []string) {
				if j.State == wire.JobQueued || j.State == wire.JobRunning {
					t.Fatalf("admitted job %s: must never run again", j.State)
				}
				// K13: the next turn verifies and resumes the retained sandbox.
				if conv.State != wire.ConversationQuarantined || len(removed) != 0 {
					t.Fatalf("conversation %s, removed %v", conv.State, removed)
				}
				// S5: the job names why it ended, and the evidence.
				if j.Cause != wire.CauseDaemonRestart || j.CauseEvidence == "" {
					t.Fatalf("job cause %q (%q), want %s with its evidence", j.Cause, j.CauseEvidence, wire.CauseDaemonRestart)
				}
			},
		},
		{
			name: "lease rejected (already finished): nothing written", report: true, finished: true, decision: decisionRejected,
			check: func(t *testing.T, c *cp, j wire.Job, conv wire.Conversation, removed []string) {
				if j.Attempts[0].Outcome != wire.OutcomeCancelled {
					t.Fatalf("the persisted report overwrote the outcome: %s", j.Attempts[0].Outcome)
				}
			},
		},
		{
			name: "lease rejected (expired): nothing written", expire: time.Hour, decision: decisionRejected,
			check: func(t *testing.T, c *cp, j wire.Job, conv wire.Conversation, removed []string) {
				if j.Attempts[0].State != wire.AttemptRunning || j.Attempts[0].EndedAt != nil {
					t.Fatalf("attempt %s: the daemon wrote about an expired lease", j.Attempts[0].State)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCP(t)
			rm := &removals{}
			d, logs := newTestDaemon(t, c, func(cfg *Config) { cfg.Backend = rm })
			job := c.enqueue("restart")
			cl := c.claim(testTimings.LeaseTTL)
			ref := wire.AttemptRef{AttemptID: cl.AttemptID, LeaseGeneration: cl.LeaseGeneration}
			ctx := context.Background()
			if tt.admit {
				if _, err := c.wc.Admission(ctx, cl.WorkerToken, cl.JobID, wire.AdmissionRequest{AttemptRef: ref, ActivationID: "act-1"}); err != nil {
					t.Fatal(err)
				}
			}
			if tt.finished {
				if _, err := c.wc.Finish(ctx, cl.WorkerToken, cl.JobID, wire.FinishRequest{AttemptRef: ref, Outcome: wire.OutcomeCancelled}); err != nil {
					t.Fatal(err)
				}
			}
			c.advance(tt.expire)
			rec := record{Claim: cl, ClaimedAt: time.Now()}
			if tt.report {
				rec.Report = &settlement.Report{Finish: &wire.FinishRequest{AttemptRef: ref, Outcome: wire.OutcomeFailed, Class: "scripted"}}
			}
			if err := d.state.save(rec); err != nil {
				t.Fatal(err)
			}
			before := c.job(job.ID)

			recs, _ := d.state.load()
			if len(recs) != 1 {
				t.Fatalf("%d records", len(recs))
			}
			if got := d.recoverOne(ctx, recs[0]); got != tt.decision {
				t.Fatalf("decision %q, want %q\n%s", got, tt.decision, logs)
			}
			if d.state.exists(cl.AttemptID) {
				t.Fatal("the attempt is still persisted")
			}
			j := c.job(job.ID)
			if tt.decision == decisionRejected {
				// Nothing written: the only new event may be the control
				// plane's note of the refused renewal that asked.
				var added []string
				for _, e := range j.Events[len(before.Events):] {
					added = append(added, e.Type)
				}
				if len(added) > 1 || len(added) == 1 && added[0] != "lease.stale_report" {
					t.Fatalf("events after the rejected lease: %v", added)
				}
				if j.State != before.State || j.Outcome != before.Outcome {
					t.Fatalf("job changed: %s/%s → %s/%s", before.State, before.Outcome, j.State, j.Outcome)
				}
			}
			tt.check(t, c, j, c.conversation(job.ConversationID), rm.removed())
			if n := logs.count(MsgRecovered); n != 1 {
				t.Fatalf("%d %s records", n, MsgRecovered)
			}
			logs.noSecrets(t, cl.WorkerToken, c.hostToken)
		})
	}
}

// A control plane that does not answer for a whole lease leaves the
// attempt persisted for the next start: no decision on local state alone.
func TestRestartKeepsAttemptWhenControlPlaneUnreachable(t *testing.T) {
	c := newCP(t)
	c.enqueue("restart")
	cl := c.claim(testTimings.LeaseTTL)
	d, logs := newTestDaemon(t, c, func(cfg *Config) {
		cfg.ControlPlaneURL = "http://127.0.0.1:1" // nothing listens on port 1
		cfg.Timings.LeaseTTL = 1500 * time.Millisecond
	})
	if err := d.state.save(record{Claim: cl, ClaimedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if got := d.recoverOne(context.Background(), mustLoadOne(t, d)); got != decisionUnreachable {
		t.Fatalf("decision %q", got)
	}
	if el := time.Since(start); el < time.Second || el > 10*time.Second {
		t.Fatalf("gave up after %v, want about one lease", el)
	}
	if !d.state.exists(cl.AttemptID) {
		t.Fatal("the attempt was forgotten without an answer")
	}
	if n := logs.count("agent_control_failure"); n != 1 {
		t.Fatalf("%d control failure records for one outage", n)
	}
}

func mustLoadOne(t *testing.T, d *Daemon) record {
	t.Helper()
	recs, bad := d.state.load()
	if len(recs) != 1 || len(bad) != 0 {
		t.Fatalf("%d records, bad %v", len(recs), bad)
	}
	return recs[0]
}
