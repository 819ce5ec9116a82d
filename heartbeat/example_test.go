package heartbeat_test

import (
	"context"
	"log/slog"
	"time"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/heartbeat"
	"github.com/runnerd/runnerd/wire"
)

// How the daemon wires the renewer: timings once at start-up, one renewal
// client for the host, one Renewer per claimed attempt.
func Example() {
	// cmd/runnerd: flags and environment are read there and passed in.
	timings, warnings, err := heartbeat.ResolveTimings(heartbeat.TimingInputs{LeaseTTLEnv: "90s"})
	if err != nil {
		panic(err) // main prints it and exits non-zero
	}
	log := slog.Default()
	rec := diagnostics.NewRecorder(log)
	for _, w := range warnings {
		rec.ConfigIgnored(context.Background(), w.Setting, w.Given, w.Used, w.Reason)
	}
	renewals := &wire.Client{
		BaseURL: "https://cp.example",
		HTTP:    heartbeat.NewHTTPClient(heartbeat.HTTPConfig{RequestTimeout: timings.RequestTimeout}),
	}

	// Per attempt, right after the claim answer (sent = when the claim
	// request went out).
	var claim wire.Claim
	sent := time.Now()
	r := heartbeat.Start(heartbeat.Config{Timings: timings, Client: renewals, Logger: log},
		heartbeat.AttemptFromClaim(claim, sent))

	turnDone := make(chan struct{}) // closed when the child sent RESULT
	select {
	case <-r.CancelRequested():
		// Drain or release the turn while renewal goes on (R13), then end it.
		r.Stop()
	case <-turnDone:
		// Send finish, then end renewal.
		r.Stop()
	case <-r.Done():
		// Lost, CredentialRefused or Expired: STOP the child now and write
		// nothing more about this attempt.
	}
	v := r.Verdict() // waits for the verdict
	_ = v.Err()
}
