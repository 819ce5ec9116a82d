package docker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/docker/docker/client"

	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/docker"
)

// Probe answers nil for a host whose engine answers, and the class of what
// is missing otherwise: the engine's socket, the network, the runnerd
// binary to bind-mount. It creates nothing (newBackend checks).
func TestDockerProbe(t *testing.T) {
	unreachable, err := client.NewClientWithOpts(client.WithHost("unix:///nonexistent/docker.sock"), client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer unreachable.Close()
	for _, tc := range []struct {
		name   string
		modify func(*docker.Config)
		class  string
	}{
		{"engine answers", nil, ""},
		{"socket missing", func(c *docker.Config) { c.Engine = unreachable }, sandbox.ClassEngineUnreachable},
		{"network missing", func(c *docker.Config) { c.Network = "runnerd-test-no-such-network" }, sandbox.ClassNetworkMissing},
		{"runnerd missing", func(c *docker.Config) { c.RunnerdPath = "/nonexistent/runnerd" }, sandbox.ClassSupervisorMissing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := newBackend(t, tc.modify)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := b.Probe(ctx)
			var pe *sandbox.PreflightError
			switch {
			case tc.class == "" && err != nil:
				t.Fatalf("Probe: %v", err)
			case tc.class != "" && (!errors.As(err, &pe) || pe.Class != tc.class):
				t.Fatalf("Probe = %v, want class %s", err, tc.class)
			}
		})
	}
}
