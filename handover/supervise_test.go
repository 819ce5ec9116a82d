package handover

import (
	"errors"
	"testing"
)

// TestStateOutcome: what the parent proves follows from the state its
// events left, phase by phase (R33, R34, R35): only a close, a DECLINE or
// an undelivered payload before any forced stop is proof the child never
// accepted; a forced stop makes a later close no proof; once accepted, the
// end belongs to the lease protocol.
func TestStateOutcome(t *testing.T) {
	for _, tc := range []struct {
		name    string
		st      state
		want    Outcome
		class   string
		release bool
	}{
		{"delivered, then EOF", state{phase: phaseEnded, answer: phaseDelivered, eofBefore: true}, OutcomeDeclined, ClassClosed, true},
		{"DECLINE", state{phase: phaseEnded, answer: phaseDelivered, declineClass: "preflight_failed"}, OutcomeDeclined, "preflight_failed", true},
		{"payload write failed", state{phase: phaseEnded, answer: phaseLaunching, undelivered: true}, OutcomePayloadUndelivered, "payload_undelivered", true},
		{"stopped, then EOF", state{phase: phaseEnded, answer: phaseDelivered, forced: true, requested: true}, OutcomeUnconfirmed, ClassStopped, false},
		{"execution timeout", state{phase: phaseEnded, answer: phaseDelivered, forced: true, timedOut: true}, OutcomeUnconfirmed, ClassExecutionTimeout, false},
		{"wrong echo", state{phase: phaseEnded, answer: phaseDelivered, forced: true, protoErr: errors.New("echo"), protoClass: ClassBadEcho, eofBefore: true}, OutcomeUnconfirmed, ClassBadEcho, false},
		{"descriptor error", state{phase: phaseEnded, answer: phaseDelivered, cause: errors.New("x")}, OutcomeUnconfirmed, ClassDescriptor, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, na := tc.st.outcome(nil)
			if na == nil || na.Outcome != tc.want || na.Class != tc.class {
				t.Fatalf("outcome %+v, want %v (%s)", na, tc.want, tc.class)
			}
			if _, ok := na.Release(); ok != tc.release {
				t.Fatalf("release %v, want %v", ok, tc.release)
			}
		})
	}
	e, na := (&state{phase: phaseEnded, answer: phaseAccepted, haveResult: true, result: []byte("r"), forced: true, requested: true}).outcome(nil)
	if na != nil || e.Outcome != OutcomeResult || string(e.Result) != "r" || !e.Stopped {
		t.Fatalf("accepted with a RESULT: %+v, %v", e, na)
	}
	e, _ = (&state{phase: phaseEnded, answer: phaseAccepted, eofBefore: true}).outcome(nil)
	if e.Outcome != OutcomeExitedWithoutResult || e.ExitCode != -1 {
		t.Fatalf("accepted, then EOF: %+v", e)
	}
}
