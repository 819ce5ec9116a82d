package model

import "testing"

// TestProtocolKeepsSafety explores every interleaving of the correct
// protocol within the bounds and finds no state that delivers a prompt
// twice, accepts a stale write, runs one job on two hosts at once or holds
// a local deadline later than the control plane's expiry.
func TestProtocolKeepsSafety(t *testing.T) {
	t.Parallel()
	res := Check(Correct)
	if res.Violation != nil {
		t.Fatalf("the correct protocol breaks a safety property: %v", res.Violation)
	}
	// The bounds must leave room for the histories that matter: a job
	// claimed again after supersession or release up to the last
	// generation, turns that succeed, conversations quarantined.
	if res.ReachedMaxGen == 0 || res.Succeeded == 0 || res.Quarantined == 0 {
		t.Fatalf("the bounds are too tight: %+v", res)
	}
	t.Logf("%d states explored, no violation (%d at generation %d, %d succeeded, %d quarantined)",
		res.States, res.ReachedMaxGen, MaxGen, res.Succeeded, res.Quarantined)
}

// TestCheckerCatchesBrokenProtocols breaks one rule at a time and expects
// the checker to find the property that rule protects: the checker can fail.
func TestCheckerCatchesBrokenProtocols(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		variant Variant
		want    string
	}{
		{"P1 no generation fence", NoGenerationFence, "stale write accepted"},
		{"R33 R36 release after the agent ran", ReleaseIgnoresAdmission, "prompt delivered twice"},
		{"R10 K5 no local deadline", NoLocalDeadline, "overlapping executions of one job"},
		{"R10 deadline counted from the answer", DeadlineFromAnswer, "local deadline after the server's expiry"},
		{"R30 K13 reaper requeues admitted work", RequeueAdmitted, "prompt delivered twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := Check(tt.variant)
			if res.Violation == nil {
				t.Fatalf("%v: no violation found in %d states", tt.variant, res.States)
			}
			if res.Violation.Property != tt.want {
				t.Fatalf("%v: found %q, want %q\n%v", tt.variant, res.Violation.Property, tt.want, res.Violation)
			}
			if len(res.Violation.Trace) == 0 || safety(res.Violation.State) == "" {
				t.Fatalf("%v: a violation without its trace or state: %+v", tt.variant, res.Violation)
			}
			t.Logf("%v", res.Violation)
		})
	}
}
