package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLeanDependencies: runnerd-child exists to start without the
// packages only the daemon or the Docker backend need, whose package
// initialisation every turn would pay. An import that
// brings one of them back fails here rather than in a benchmark.
func TestLeanDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	heavy := []string{
		"github.com/prometheus/",
		"github.com/coreos/go-systemd/",
		"github.com/docker/",
		"github.com/distribution/",
		"github.com/runnerd/runnerd/sandbox/docker",
		"github.com/runnerd/runnerd/runner\n", // the daemon package itself
		"github.com/runnerd/runnerd/controlplane",
	}
	deps := string(out)
	for _, h := range heavy {
		if strings.Contains(deps, "\n"+h) || strings.HasPrefix(deps, h) {
			t.Errorf("runnerd-child depends on %s", strings.TrimSpace(h))
		}
	}
}
