package handover_test

import (
	"context"
	"errors"
	"os"

	"github.com/runnerd/runnerd/handover"
)

// The daemon's side of one turn. release and finish stand for the runner's
// calls to the control plane.
func ExampleLaunch() {
	var (
		release = func(r handover.Releasable) {} // POST .../release with r.Class()
		finish  = func(outcome, class string) {} // POST .../finish
		data    = []byte(`{"worker_token":"…"}`) // the claim-derived payload
		events  = func(body []byte) {}           // upload queue
	)
	exe, _ := os.Executable()
	cfg := handover.Config{Path: exe, Args: []string{"turn"}, OnProgress: events}
	p := handover.Payload{Echo: handover.Echo{AttemptID: "att-1", LeaseGeneration: 3}, Data: data}

	turn, err := handover.Launch(context.Background(), cfg, p)
	var na *handover.NotAccepted
	if errors.As(err, &na) {
		if r, ok := na.Release(); ok {
			release(r) // spawn failed, payload undelivered or declined (R33)
			return
		}
		finish("failed", na.Class) // unconfirmed: never a release (R34)
		return
	}
	// On lease loss: turn.StopWith("lease_lost").
	end := turn.Wait() // after ACCEPT: the lease protocol decides (R35)
	switch end.Outcome {
	case handover.OutcomeResult:
		finish("succeeded", "") // or what end.Result says
	default: // exited without result, or killed
		finish("failed", end.Outcome.String())
	}
}

// The child's side: `runnerd turn`.
func ExampleOpenFromEnv() {
	ch, err := handover.OpenFromEnv() // reads and unsets RUNNERD_HANDOVER_FD
	if err != nil {
		os.Exit(2) // no descriptor, or the parent is already gone
	}
	defer ch.Close()
	preflightOK := true // read-only checks only, before ACCEPT
	if !preflightOK {
		ch.Decline("preflight_failed")
		return
	}
	if err := ch.Accept(); err != nil {
		return // not accepted: the parent sees EOF and may release
	}
	ctx := ch.Context() // cancelled on STOP or when the parent is gone
	_ = ctx             // … admission, prompt once, stream loop, settlement …
	ch.Progress([]byte(`{"type":"event"}`))
	ch.Result([]byte(`{"outcome":"succeeded"}`))
}
