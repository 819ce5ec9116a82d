package turn

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/runnerd/runnerd/handover"
	"github.com/runnerd/runnerd/internal/retry"
	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/settlement"
	"github.com/runnerd/runnerd/wire"
)

// fakeBackend stands in only for Preflight's answer; the real backends are
// exercised through real turn children in the runner and integration tests.
type fakeBackend struct {
	sandbox.Backend
	err   error
	calls int
}

func (b *fakeBackend) Preflight(context.Context, sandbox.Spec) error { b.calls++; return b.err }

func TestPreflightDeclineClasses(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"healthy", nil, ""},
		{"backend class is the decline class", &sandbox.PreflightError{Class: sandbox.ClassImageUnavailable}, sandbox.ClassImageUnavailable},
		{"unclassified failure", errors.New("boom"), "preflight_failed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &fakeBackend{err: tt.err}
			if got := preflight(context.Background(), b, sandbox.Spec{}); got != tt.want {
				t.Fatalf("preflight = %q, want %q", got, tt.want)
			}
			if b.calls != 1 {
				t.Fatalf("backend preflight called %d times, want once", b.calls)
			}
		})
	}
}

// An agent that a signal ended is reported with the signal's name, not as
// a clean exit (agent_exit_0 before).
func TestExitClass(t *testing.T) {
	for _, tt := range []struct {
		res  sandbox.Result
		want string
	}{
		{sandbox.Result{ExitCode: 0}, ""},
		{sandbox.Result{ExitCode: 3}, "agent_exit_3"},
		{sandbox.Result{ExitCode: -1, Signal: "SIGKILL"}, "agent_signal_KILL"},
		{sandbox.Result{ExitCode: -1, Signal: "SIGSEGV"}, "agent_signal_SEGV"},
		{sandbox.Result{ExitCode: -1}, "agent_signal_unknown"},
	} {
		if got := exitClass(tt.res); got != tt.want {
			t.Errorf("exitClass(%+v) = %q, want %q", tt.res, got, tt.want)
		}
	}
}

// The RESULT's report follows settlement's rules from the facts the turn
// established: abandon before admission with a container, LOST-making
// failure after admission, success only when settled.
func TestResultFollowsFacts(t *testing.T) {
	ref := wire.AttemptRef{AttemptID: "att_1", LeaseGeneration: 1}
	tests := []struct {
		name        string
		facts       settlement.Facts
		outcome     string
		class       string
		wantAbandon bool
		wantOutcome string
		wantAmbig   bool
	}{
		{"settled success", settlement.Facts{ContainerRecorded: true, Admitted: true, PromptSent: true, Settled: true}, wire.OutcomeSucceeded, "", false, wire.OutcomeSucceeded, false},
		{"unsettled success is a failure", settlement.Facts{ContainerRecorded: true, Admitted: true, PromptSent: true}, wire.OutcomeSucceeded, "", false, wire.OutcomeFailed, false},
		{"failure before admission with a container abandons", settlement.Facts{ContainerRecorded: true}, wire.OutcomeFailed, ClassActivation, true, "", false},
		{"failure before the container is a plain failure", settlement.Facts{}, wire.OutcomeFailed, ClassSandboxUnavailable, false, wire.OutcomeFailed, false},
		{"ambiguous admission", settlement.Facts{ContainerRecorded: true, Ambiguous: true}, wire.OutcomeFailed, settlement.ClassAdmissionAmbiguous, false, wire.OutcomeFailed, true},
		{"native boundary mismatch is unrecoverable", settlement.Facts{}, wire.OutcomeFailed, ClassBoundaryMismatch, false, wire.OutcomeFailed, false},
		{"lost workspace is unrecoverable", settlement.Facts{}, wire.OutcomeFailed, ClassWorkspaceLost, false, wire.OutcomeFailed, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := result(tt.facts, ref, tt.outcome, tt.class)
			if tt.wantAbandon {
				if r.Report.Abandon == nil || r.Report.Finish != nil {
					t.Fatalf("report = %+v, want an abandon", r.Report)
				}
				return
			}
			f := r.Report.Finish
			if f == nil || r.Report.Abandon != nil {
				t.Fatalf("report = %+v, want a finish", r.Report)
			}
			wantUnrecoverable := tt.class == ClassBoundaryMismatch || tt.class == ClassWorkspaceLost
			if f.Unrecoverable != wantUnrecoverable {
				t.Fatalf("finish = %+v, want unrecoverable %v", f, wantUnrecoverable)
			}
			if f.Outcome != tt.wantOutcome || r.Outcome != tt.wantOutcome || f.Ambiguous != tt.wantAmbig || f.AttemptRef != ref {
				t.Fatalf("finish = %+v (result outcome %q), want outcome %q ambiguous %v", f, r.Outcome, tt.wantOutcome, tt.wantAmbig)
			}
		})
	}
}

// R8, R10: the daemon's STOP "lease_lost" fences the child's Session, so
// neither the event uploader nor the final flush writes about the attempt
// again; other STOP classes leave it writing (R13: a cancelled turn still
// reports). The control plane address answers nothing: a write that tried
// to go out would fail with a transport error, not ErrLeaseRejected.
func TestLeaseLostStopFencesTheSession(t *testing.T) {
	tests := []struct {
		name   string
		cause  error
		fenced bool
	}{
		{"lease lost", &handover.StopError{Class: StopLeaseLost}, true},
		{"user cancel", &handover.StopError{Class: ClassCancelled}, false},
		{"drain timeout", &handover.StopError{Class: StopDrainTimeout}, false},
		{"parent gone", errors.New("descriptor closed"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				sess, err := settlement.New(settlement.Config{
					BaseURL: "http://127.0.0.1:1", WorkerToken: "rdw_test", JobID: "job_1",
					Attempt:  wire.AttemptRef{AttemptID: "att_1", LeaseGeneration: 1},
					Logger:   slog.New(slog.DiscardHandler),
					Receipts: retry.Policy{TryTimeout: time.Second, Wait: time.Millisecond},
				})
				if err != nil {
					t.Fatal(err)
				}
				defer sess.Close()
				ctx, cancel := context.WithCancelCause(context.Background())
				defer fenceOnLeaseLoss(ctx, sess)()
				cancel(tt.cause)
				synctest.Wait()
				if sess.Rejected() != tt.fenced || stoppedForLeaseLoss(ctx) != tt.fenced {
					t.Fatalf("fenced %v (stopped for lease loss %v), want %v", sess.Rejected(), stoppedForLeaseLoss(ctx), tt.fenced)
				}
				if tt.fenced {
					if err := sess.RecordContainer(context.Background(), sandbox.BackendProcess, "c1"); !errors.Is(err, settlement.ErrLeaseRejected) {
						t.Fatalf("a write after the fence: %v, want ErrLeaseRejected without a request", err)
					}
				}
			})
		})
	}
}

// A failed turn stopped by the daemon reports what the daemon's own
// fallback would for that STOP: cancelled for a user cancel, worker_lost
// for a drain timeout or shutdown (P6); a lease loss keeps the turn's own
// failure; the execution deadline — the child's own or the daemon's STOP —
// is execution_timeout whatever phase failed (K6); a succeeded turn stays
// succeeded.
func TestOutcomeFollowsStop(t *testing.T) {
	stop := func(class string) error { return &handover.StopError{Class: class} }
	tests := []struct {
		name        string
		cause       error
		outcome     string
		class       string
		wantOutcome string
		wantClass   string
	}{
		{"no stop", nil, wire.OutcomeFailed, ClassAgentInterrupted, wire.OutcomeFailed, ClassAgentInterrupted},
		{"user cancel", stop(ClassCancelled), wire.OutcomeFailed, ClassAgentInterrupted, wire.OutcomeCancelled, ClassCancelled},
		{"drain timeout", stop(StopDrainTimeout), wire.OutcomeFailed, ClassActivation, wire.OutcomeWorkerLost, ClassHostStopped},
		{"shutdown", stop(StopShutdown), wire.OutcomeFailed, ClassAgentInterrupted, wire.OutcomeWorkerLost, ClassHostStopped},
		{"lease lost", stop(StopLeaseLost), wire.OutcomeFailed, ClassAgentInterrupted, wire.OutcomeFailed, ClassAgentInterrupted},
		{"execution timeout", stop(handover.ClassExecutionTimeout), wire.OutcomeFailed, ClassExecTimeout, wire.OutcomeFailed, ClassExecTimeout},
		{"daemon's execution timeout in settlement", stop(handover.ClassExecutionTimeout), wire.OutcomeFailed, ClassSettlement, wire.OutcomeFailed, ClassExecTimeout},
		{"own execution deadline in preparation", handover.ErrExecutionDeadline, wire.OutcomeFailed, ClassSandboxUnavailable, wire.OutcomeFailed, ClassExecTimeout},
		{"own execution deadline in admission", handover.ErrExecutionDeadline, wire.OutcomeFailed, ClassAdmissionRefused, wire.OutcomeFailed, ClassExecTimeout},
		{"succeeded before the cancel", stop(ClassCancelled), wire.OutcomeSucceeded, "", wire.OutcomeSucceeded, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(context.Background())
			if tt.cause != nil {
				cancel(tt.cause)
			}
			defer cancel(nil)
			if o, c := byStop(ctx, tt.outcome, tt.class); o != tt.wantOutcome || c != tt.wantClass {
				t.Fatalf("byStop = %s/%s, want %s/%s", o, c, tt.wantOutcome, tt.wantClass)
			}
		})
	}
}

// R13, R28: once the agent has exited, settlement goes on through the
// user's cancel (a completed turn is settled, not failed closed), but any
// other end of the turn's context ends it, with that cause — and so do the
// execution deadline and the lease fence, even after the cancel (K5, K6).
func TestSettlementIgnoresOnlyTheUserCancel(t *testing.T) {
	gone := errors.New("descriptor closed")
	tests := []struct {
		name  string
		cause error
		ended bool
	}{
		{"user cancel", &handover.StopError{Class: ClassCancelled}, false},
		{"lease lost", &handover.StopError{Class: StopLeaseLost}, true},
		{"drain timeout", &handover.StopError{Class: StopDrainTimeout}, true},
		{"shutdown", &handover.StopError{Class: StopShutdown}, true},
		{"daemon gone", gone, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancelCause(context.Background())
				deadlines, endDeadlines := context.WithCancelCause(context.Background())
				fence, endFence := context.WithCancelCause(context.Background())
				defer endDeadlines(nil)
				defer endFence(nil)
				sctx, release := ignoringCancel(ctx, deadlines, fence)
				cancel(tt.cause)
				synctest.Wait()
				if ended := sctx.Err() != nil; ended != tt.ended {
					t.Fatalf("settlement context ended %v, want %v", ended, tt.ended)
				}
				if tt.ended && context.Cause(sctx) != tt.cause {
					t.Fatalf("cause %v, want %v", context.Cause(sctx), tt.cause)
				}
				release()
				if sctx.Err() == nil {
					t.Fatal("release left the settlement context open")
				}
			})
		})
	}
	for _, late := range []struct {
		name  string
		cause error
		fence bool
	}{
		{"execution deadline after the cancel", handover.ErrExecutionDeadline, false},
		{"lease deadline after the cancel", handover.ErrLeaseExpired, true},
		{"lease rejected after the cancel", settlement.ErrLeaseRejected, true},
	} {
		t.Run(late.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancelCause(context.Background())
				deadlines, endDeadlines := context.WithCancelCause(context.Background())
				fence, endFence := context.WithCancelCause(context.Background())
				defer endDeadlines(nil)
				defer endFence(nil)
				sctx, release := ignoringCancel(ctx, deadlines, fence)
				defer release()
				cancel(&handover.StopError{Class: ClassCancelled})
				synctest.Wait()
				if sctx.Err() != nil {
					t.Fatal("the user's cancel ended settlement")
				}
				if late.fence {
					endFence(late.cause)
				} else {
					endDeadlines(late.cause)
				}
				synctest.Wait()
				if !errors.Is(context.Cause(sctx), late.cause) {
					t.Fatalf("cause %v, want %v", context.Cause(sctx), late.cause)
				}
			})
		})
	}
}

// K13, R31: what a turn accepts of the retained sandbox before anything is
// recorded or admitted. A usable conversation needs the settled native
// turn; a quarantined one needs the exact recorded container and the
// settled native turn or one more (the interrupted turn reached the
// agent), and its failures are reported unrecoverable.
func TestVerifyRetainedSandbox(t *testing.T) {
	const ctr, act = "sb-1", "inst.7.f00d"
	// rec is the supervisor's retained record of activation id at boundary n.
	rec := func(id string, n int64, ended string) *sandbox.Retained {
		return &sandbox.Retained{Activation: id, NativeTurn: n, Ended: ended}
	}
	// notRunAfter is the record of activation id, which ran nothing, the
	// last one to run a turn before it being last.
	notRunAfter := func(id string, n int64, last string) *sandbox.Retained {
		return &sandbox.Retained{Activation: id, NativeTurn: n, Ended: sandbox.EndedNotRun, LastRan: last}
	}
	// unrecorded is the record of activation id (none: the record of the
	// take-over itself), which ran nothing, in a state taken over from a
	// release that kept no records, no turn run since.
	unrecorded := func(id string, n int64) *sandbox.Retained {
		return &sandbox.Retained{Activation: id, NativeTurn: n, Ended: sandbox.EndedNotRun, Unrecorded: true}
	}
	for _, tt := range []struct {
		name        string
		quarantined bool
		recorded    string            // the control plane's container id
		sandbox     string            // Ensure's sandbox id
		native      int64             // the supervisor's native turn; the settled one is 4
		previous    *sandbox.Retained // what the supervisor retains of the activation it fenced
		want        string
	}{
		{"usable, same boundary", false, ctr, ctr, 4, nil, ""},
		{"usable, one ahead is not the settled session", false, ctr, ctr, 5, nil, ClassBoundaryMismatch},
		{"usable, container made anew over the workspace", false, ctr, "sb-2", 4, nil, ""},
		{"quarantined, interrupted before the agent", true, ctr, ctr, 4, rec(act, 4, sandbox.EndedNotRun), ""},
		{"quarantined, interrupted after the agent", true, ctr, ctr, 5, rec(act, 5, "connection_dropped"), ""},
		{"quarantined, completed, settlement lost", true, ctr, ctr, 5, rec(act, 5, sandbox.EndedCompleted), ""},
		{"quarantined, boundary changed", true, ctr, ctr, 6, rec(act, 6, sandbox.EndedCompleted), ClassBoundaryMismatch},
		{"quarantined, boundary behind", true, ctr, ctr, 3, rec(act, 3, sandbox.EndedCompleted), ClassBoundaryMismatch},
		{"quarantined, supervisor lost its state", true, ctr, ctr, 0, nil, ClassReceiptMismatch},
		{"quarantined, container replaced", true, ctr, "sb-2", 5, rec(act, 5, sandbox.EndedCompleted), ClassContainerReplaced},
		{"quarantined, no container recorded", true, "", "sb-2", 4, rec(act, 4, sandbox.EndedNotRun), ClassContainerReplaced},
		// The retained receipt (R26) is the positive evidence: a boundary
		// that looks right proves nothing without it.
		{"quarantined, restarted supervisor with no record, same boundary", true, ctr, ctr, 5, nil, ClassReceiptMismatch},
		{"quarantined, record of another activation, same boundary", true, ctr, ctr, 5, rec("inst.6.beef", 5, sandbox.EndedCompleted), ClassReceiptMismatch},
		{"quarantined, record disagrees with the boundary", true, ctr, ctr, 5, rec(act, 4, sandbox.EndedNotRun), ClassReceiptMismatch},
		// A later activation that verified and ran nothing names the
		// interrupted one as the last that ran; one that ran a turn does not.
		{"quarantined, a later activation ran nothing since", true, ctr, ctr, 5, notRunAfter("inst.8.cafe", 5, act), ""},
		{"quarantined, a later activation ran nothing since another", true, ctr, ctr, 5, notRunAfter("inst.8.cafe", 5, "inst.6.beef"), ClassReceiptMismatch},
		// The interrupted activation was admitted and ran nothing itself,
		// and so did the ones after it: the record lists it among them.
		{"quarantined, interrupted ran nothing, later ones neither", true, ctr, ctr, 4,
			&sandbox.Retained{Activation: "inst.9.aaaa", NativeTurn: 4, Ended: sandbox.EndedNotRun, LastRan: "inst.6.beef", Idle: []string{act, "inst.8.cafe"}}, ""},
		{"quarantined, others ran nothing, not the interrupted one", true, ctr, ctr, 4,
			&sandbox.Retained{Activation: "inst.9.aaaa", NativeTurn: 4, Ended: sandbox.EndedNotRun, LastRan: "inst.6.beef", Idle: []string{"inst.8.cafe"}}, ClassReceiptMismatch},
		{"quarantined, idle list on a record that ran a turn", true, ctr, ctr, 4,
			&sandbox.Retained{Activation: "inst.9.aaaa", NativeTurn: 4, Ended: sandbox.EndedCompleted, Idle: []string{act}}, ClassReceiptMismatch},
		{"quarantined, a later activation ran a turn", true, ctr, ctr, 5, &sandbox.Retained{Activation: "inst.8.cafe", NativeTurn: 5, Ended: sandbox.EndedCompleted, LastRan: act}, ClassReceiptMismatch},
		// A state of the previous release, which kept no records: the
		// supervisor that took it over says so (Unrecorded), and the turn
		// interrupted under that release is verified as that release did —
		// the exact container and the boundary. A state of a release that
		// keeps records (StateVersionFile) whose record is gone is not.
		{"quarantined, previous-release state, no record, interrupted after the agent", true, ctr, ctr, 5, unrecorded("", 5), ""},
		{"quarantined, previous-release state, no record, interrupted before the agent", true, ctr, ctr, 4, unrecorded("", 4), ""},
		{"quarantined, previous-release state, a later activation ran nothing since", true, ctr, ctr, 5, unrecorded("inst.8.cafe", 5), ""},
		{"quarantined, previous-release state, boundary changed", true, ctr, ctr, 6, unrecorded("", 6), ClassBoundaryMismatch},
		{"quarantined, previous-release state, record disagrees with the boundary", true, ctr, ctr, 5, unrecorded("", 4), ClassReceiptMismatch},
		{"quarantined, previous-release state, container replaced", true, ctr, "sb-2", 5, unrecorded("", 5), ClassContainerReplaced},
		{"quarantined, record-keeping state, record gone", true, ctr, ctr, 5, nil, ClassReceiptMismatch},
		{"quarantined, unrecorded on a record that ran a turn", true, ctr, ctr, 5, &sandbox.Retained{Activation: "inst.8.cafe", NativeTurn: 5, Ended: sandbox.EndedCompleted, Unrecorded: true}, ClassReceiptMismatch},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tu := &turn{log: slog.New(slog.DiscardHandler)}
			tu.p.Claim.Turn = wire.Turn{ContainerID: tt.recorded, NativeTurn: 4, Quarantined: tt.quarantined}
			if tt.quarantined {
				tu.p.Claim.Turn.InterruptedActivationID = act
			}
			got := tu.verify(sandbox.Sandbox{ID: tt.sandbox, Version: sandbox.ProtocolVersion}, sandbox.Activation{ID: "act-next", NativeTurn: tt.native, Previous: tt.previous})
			if got != tt.want {
				t.Fatalf("verify = %q, want %q", got, tt.want)
			}
			if got == "" {
				return
			}
			// A failed verification is reported unrecoverable before any
			// admission: the conversation becomes LOST, nothing is replayed.
			ref := wire.AttemptRef{AttemptID: "a", LeaseGeneration: 1}
			res := result(settlement.Facts{}, ref, wire.OutcomeFailed, got)
			if res.Report.Finish == nil || !res.Report.Finish.Unrecoverable {
				t.Fatalf("report of %s = %+v, want an unrecoverable finish", got, res.Report)
			}
		})
	}
}

// TestVerifyOutdatedSupervisorKeepsTheQuarantine: a supervisor of the
// release before retained records (protocol version 1, one the backend
// could not replace because it was busy) has no record to show. For a
// quarantined conversation that is no evidence of a loss: the turn fails
// before admission as sandbox_unavailable, which is not unrecoverable, so
// the conversation stays quarantined for the next message. A usable
// conversation is verified as before.
func TestVerifyOutdatedSupervisorKeepsTheQuarantine(t *testing.T) {
	const ctr = "sb-1"
	ref := wire.AttemptRef{AttemptID: "a", LeaseGeneration: 1}
	for _, quarantined := range []bool{true, false} {
		tu := &turn{log: slog.New(slog.DiscardHandler)}
		tu.p.Claim.Turn = wire.Turn{ContainerID: ctr, NativeTurn: 4, Quarantined: quarantined, InterruptedActivationID: "inst.7.f00d"}
		got := tu.verify(sandbox.Sandbox{ID: ctr, Version: sandbox.Version1}, sandbox.Activation{ID: "act-next", NativeTurn: 4})
		switch {
		case quarantined && got != ClassSandboxUnavailable:
			t.Fatalf("quarantined: verify = %q, want %q", got, ClassSandboxUnavailable)
		case !quarantined && got != "":
			t.Fatalf("usable: verify = %q, want it verified", got)
		}
		if quarantined {
			res := result(settlement.Facts{}, ref, wire.OutcomeFailed, got)
			if res.Report.Finish != nil && res.Report.Finish.Unrecoverable {
				t.Fatalf("report of %s = %+v: the conversation would be LOST", got, res.Report)
			}
		}
	}
}
