package docker

import (
	"context"
	"errors"
	"fmt"
	"os"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/network"

	"github.com/runnerd/runnerd/sandbox"
)

// Preflight checks, reading only, that a turn of the conversation can start
// on this host: the spec is usable, the runnerd binary to bind-mount is
// there, the engine answers, the image reference is valid and — under
// --pull never — the image is here (a pull, which changes the host, is
// Ensure's, after ACCEPT), the configured network exists, and the conversation's retained
// container, if there is one, can be inspected. It starts, creates and
// changes nothing, so a failure lets the host release the claim (R33).
// Every failure is a *sandbox.PreflightError.
func (b *Backend) Preflight(ctx context.Context, spec sandbox.Spec) error {
	fail := func(class string, err error) error { return &sandbox.PreflightError{Class: class, Err: err} }
	if err := validSpec(spec); err != nil {
		return fail(sandbox.ClassInvalidSpec, err)
	}
	if len(spec.AgentCommand) == 0 || spec.AgentCommand[0] == "" {
		return fail(sandbox.ClassAgentMissing, errors.New("empty agent command"))
	}
	if spec.Limits.DiskBytes != 0 {
		// Limits: the control plane refuses disk_bytes; one that sends it
		// anyway gets no silently unbounded workspace.
		return fail(sandbox.ClassLimitsUnsupported, errors.New("disk_bytes: the workspace volume has no quota"))
	}
	if fi, err := os.Stat(b.cfg.RunnerdPath); err != nil {
		return fail(sandbox.ClassSupervisorMissing, err)
	} else if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return fail(sandbox.ClassSupervisorMissing, fmt.Errorf("%s is not an executable file", b.cfg.RunnerdPath))
	}
	if _, err := b.cfg.Engine.Ping(ctx); err != nil {
		return fail(sandbox.ClassEngineUnreachable, err)
	}
	if err := validImageRef(spec.Image); err != nil {
		return fail(sandbox.ClassImageUnavailable, fmt.Errorf("image %q: %w", spec.Image, err))
	}
	if b.cfg.Pull == PullNever {
		// Nothing will be pulled: an image not here now never will be, and
		// releasing lets a host that has it take the turn.
		if _, err := b.cfg.Engine.ImageInspect(ctx, spec.Image); err != nil {
			if cerrdefs.IsNotFound(err) {
				return fail(sandbox.ClassImageUnavailable, fmt.Errorf("image %q is not on this host and --pull is never", spec.Image))
			}
			return fail(sandbox.ClassEngineUnreachable, fmt.Errorf("inspect image: %w", err))
		}
	}
	if _, err := b.cfg.Engine.NetworkInspect(ctx, b.cfg.Network, network.InspectOptions{}); err != nil {
		if cerrdefs.IsNotFound(err) {
			return fail(sandbox.ClassNetworkMissing, fmt.Errorf("network %q does not exist", b.cfg.Network))
		}
		return fail(sandbox.ClassEngineUnreachable, fmt.Errorf("inspect network: %w", err))
	}
	found, ok, err := b.findContainer(ctx, spec.ConversationID)
	if errors.Is(err, ErrAmbiguous) {
		return fail(sandbox.ClassSandboxBroken, err)
	}
	if err != nil {
		return fail(sandbox.ClassEngineUnreachable, err)
	}
	if ok {
		// Gone between list and inspect is fine: Ensure will make it anew.
		if _, err := b.cfg.Engine.ContainerInspect(ctx, found.ID); err != nil && !cerrdefs.IsNotFound(err) {
			return fail(sandbox.ClassSandboxBroken, fmt.Errorf("inspect container: %w", err))
		}
	}
	return nil
}
