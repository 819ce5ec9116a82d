package docker_test

import (
	"context"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/runnerd/runnerd/sandbox"
)

// Turn start is the time from "the child wants its sandbox" to "the agent
// has the prompt": Ensure (find the retained container, supervisor answers),
// Activate, and Run up to the supervisor's "started". Each benchmark
// reports the median and the 95th percentile of its iterations. Run with
// a fixed count, e.g. -benchtime=30x: the machine is shared.

// BenchmarkDockerTurnStartWarm measures turn start on a warm retained
// container (running, supervisor up).
func BenchmarkDockerTurnStartWarm(b *testing.B) {
	be, _ := newBackend(b, nil)
	benchTurnStart(b, be, func() sandbox.Spec { return newSpec() }, true)
}

// BenchmarkDockerColdStart measures turn start for a conversation with no
// container: workspace volume and container created, container started,
// supervisor answering, activation, agent started. Removal is not timed.
func BenchmarkDockerColdStart(b *testing.B) {
	be, _ := newBackend(b, nil)
	benchTurnStart(b, be, func() sandbox.Spec { return newSpec() }, false)
}

// benchTurnStart times turn start on be. Warm: one conversation, made and
// run once before the clock starts. Cold: a new conversation each time,
// removed after its turn with the clock stopped.
func benchTurnStart(b *testing.B, be sandbox.Backend, mkSpec func() sandbox.Spec, warm bool) {
	ctx := context.Background()
	spec := mkSpec()
	if warm {
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
	}
	samples := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		if !warm {
			spec = mkSpec()
		}
		start := time.Now()
		sb, err := be.Ensure(ctx, spec)
		if err != nil {
			b.Fatal(err)
		}
		turn, act := startTurn(b, ctx, sb, spec.AgentCommand)
		samples = append(samples, time.Since(start))
		b.StopTimer()
		if sb.Created == warm {
			b.Fatalf("warm=%v but Created=%v", warm, sb.Created)
		}
		finishTurn(b, ctx, sb, turn, act)
		if !warm {
			if err := be.Remove(ctx, spec.ConversationID); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
	}
	b.StopTimer()
	reportPercentiles(b, samples)
}

func startTurn(tb testing.TB, ctx context.Context, sb sandbox.Sandbox, command []string) (*sandbox.Turn, string) {
	c := sb.Client()
	act, err := c.Activate(ctx, 0)
	if err != nil {
		tb.Fatal(err)
	}
	turn, err := c.Run(ctx, act.ID, command, "benchmark")
	if err != nil {
		tb.Fatal(err)
	}
	return turn, act.ID
}

func finishTurn(tb testing.TB, ctx context.Context, sb sandbox.Sandbox, turn *sandbox.Turn, act string) {
	defer turn.Close()
	for {
		_, err := turn.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			tb.Fatal(err)
		}
	}
	if _, err := sb.Client().Settle(ctx, act); err != nil {
		tb.Fatal(err)
	}
}

func reportPercentiles(b *testing.B, samples []time.Duration) {
	if len(samples) == 0 {
		return
	}
	slices.Sort(samples)
	pick := func(q float64) float64 {
		i := int(q*float64(len(samples))+0.5) - 1
		i = max(0, min(i, len(samples)-1))
		return float64(samples[i].Microseconds()) / 1000
	}
	b.ReportMetric(pick(0.50), "p50-ms")
	b.ReportMetric(pick(0.95), "p95-ms")
}

// BenchmarkDockerWake measures the wake of an idle-evicted conversation
// (S1): from its stopped container to the agent having the prompt — Ensure
// starts the same container and waits for its supervisor, Activate, Run up
// to the supervisor's "started". Stopping it again is not timed.
func BenchmarkDockerWake(b *testing.B) {
	be, _ := newBackend(b, nil)
	benchWake(b, be, newSpec())
}

// benchWake times the wake of spec's sandbox on be from stopped, each
// iteration stopping it first with the clock stopped.
func benchWake(b *testing.B, be interface {
	sandbox.Backend
	sandbox.Stopper
}, spec sandbox.Spec) {
	ctx := context.Background()
	b.Cleanup(func() {
		if err := be.Remove(context.Background(), spec.ConversationID); err != nil {
			b.Error(err)
		}
	})
	sb, err := be.Ensure(ctx, spec)
	if err != nil {
		b.Fatal(err)
	}
	runTurn(b, ctx, sb, spec.AgentCommand, "before the first eviction")
	spec.RecordedID = sb.ID
	samples := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		if stopped, err := be.Stop(ctx, spec.ConversationID, func() bool { return true }); !stopped || err != nil {
			b.Fatalf("stop: %v, %v", stopped, err)
		}
		b.StartTimer()
		start := time.Now()
		sb, err := be.Ensure(ctx, spec)
		if err != nil {
			b.Fatal(err)
		}
		turn, act := startTurn(b, ctx, sb, spec.AgentCommand)
		samples = append(samples, time.Since(start))
		b.StopTimer()
		if !sb.Created {
			b.Fatal("the woken sandbox was found running, not started")
		}
		finishTurn(b, ctx, sb, turn, act)
		b.StartTimer()
	}
	b.StopTimer()
	reportPercentiles(b, samples)
}
