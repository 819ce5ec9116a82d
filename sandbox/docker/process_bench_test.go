package docker_test

import (
	"testing"

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
	benchTurnStart(b, be, func() sandbox.Spec {
		return sandbox.Spec{ConversationID: "bench-" + randHex(4), AgentCommand: []string{env.hostAgent}}
	}, true)
}

// BenchmarkProcessWake is BenchmarkDockerWake on the process backend: from
// its stopped supervisor (idle eviction, S1) to the agent having the
// prompt, with the same static supervisor and agent binaries.
func BenchmarkProcessWake(b *testing.B) {
	if env.skip != "" {
		b.Skip(env.skip)
	}
	be, err := process.New(process.Config{StateDir: b.TempDir(), Command: []string{env.runnerd, "supervise"}})
	if err != nil {
		b.Fatal(err)
	}
	benchWake(b, be, sandbox.Spec{ConversationID: "bench-" + randHex(4), AgentCommand: []string{env.hostAgent}})
}
