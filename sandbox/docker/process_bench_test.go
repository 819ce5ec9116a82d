package docker_test

import (
	"context"
	"testing"
	"time"

	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/process"
)

// BenchmarkProcessTurnStartWarm is the same measurement as
// BenchmarkDockerTurnStartWarm on the process backend, with the same
// static supervisor and agent binaries, as the baseline the Docker figure
// is compared with. (A test-only import of the sibling backend.)
func BenchmarkProcessTurnStartWarm(b *testing.B) {
	if env.skip != "" {
		b.Skip(env.skip) // the binaries are built only when an engine runs
	}
	be, err := process.New(process.Config{StateDir: b.TempDir(), Command: []string{env.runnerd, "supervise"}})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	spec := sandbox.Spec{ConversationID: "bench-" + randHex(4), AgentCommand: []string{env.hostAgent}}
	b.Cleanup(func() {
		if err := be.Remove(context.Background(), spec.ConversationID); err != nil {
			b.Error(err)
		}
	})
	sb, err := be.Ensure(ctx, spec)
	if err != nil {
		b.Fatal(err)
	}
	runTurn(b, ctx, sb, spec.AgentCommand, "warm up")
	samples := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		sb, err := be.Ensure(ctx, spec)
		if err != nil {
			b.Fatal(err)
		}
		turn, act := startTurn(b, ctx, sb, spec.AgentCommand)
		samples = append(samples, time.Since(start))
		b.StopTimer()
		finishTurn(b, ctx, sb, turn, act)
		b.StartTimer()
	}
	b.StopTimer()
	reportPercentiles(b, samples)
}
