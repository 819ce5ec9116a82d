package docker

import (
	"context"
	"fmt"
	"os"

	"github.com/docker/docker/api/types/network"

	"github.com/runnerd/runnerd/sandbox"
)

// Probe checks, reading only, that this host could start any turn at all:
// the runnerd binary to bind-mount is there, the engine answers and the
// configured network exists. The daemon asks it before it claims (a host
// whose engine is gone must not claim turns only to decline them), and
// again while it fails. A failure is a *sandbox.PreflightError.
func (b *Backend) Probe(ctx context.Context) error {
	fail := func(class string, err error) error { return &sandbox.PreflightError{Class: class, Err: err} }
	if fi, err := os.Stat(b.cfg.RunnerdPath); err != nil {
		return fail(sandbox.ClassSupervisorMissing, err)
	} else if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return fail(sandbox.ClassSupervisorMissing, fmt.Errorf("%s is not an executable file", b.cfg.RunnerdPath))
	}
	if _, err := b.cfg.Engine.Ping(ctx); err != nil {
		return fail(sandbox.ClassEngineUnreachable, err)
	}
	if _, err := b.cfg.Engine.NetworkInspect(ctx, b.cfg.Network, network.InspectOptions{}); err != nil {
		return fail(sandbox.ClassNetworkMissing, fmt.Errorf("inspect network %q: %w", b.cfg.Network, err))
	}
	return nil
}
