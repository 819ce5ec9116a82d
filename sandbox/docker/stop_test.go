package docker_test

import (
	"errors"
	"log/slog"
	"testing"

	"github.com/docker/docker/api/types/container"

	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/docker"
)

// S1 against the real engine: Stop stops an idle conversation's container
// and keeps it — the same container (writable layer) and workspace volume
// — and the next Ensure starts that same container again: the native turn
// continues from the recorded boundary, over the same workspace volume, and
// the old receipt is gone (R28), as after a supervisor restart.
func TestDockerStopKeepsContainerAndEnsureStartsIt(t *testing.T) {
	rec := &recorder{}
	b, cfg, ctx, spec, sb := ensured(t, func(c *docker.Config) { c.Logger = slog.New(rec) })
	out1 := runTurn(t, ctx, sb, spec.AgentCommand, "before the eviction")
	vols := volumesOf(t, cfg.Host, spec.ConversationID)

	if stopped, err := b.Stop(ctx, spec.ConversationID, func() bool { return false }); stopped || err != nil {
		t.Fatalf("Stop with idle false: %v, %v", stopped, err)
	}
	stopped, err := b.Stop(ctx, spec.ConversationID, func() bool { return true })
	if !stopped || err != nil {
		t.Fatalf("Stop: %v, %v", stopped, err)
	}
	info, err := env.engine.ContainerInspect(ctx, sb.ID)
	if err != nil {
		t.Fatalf("the stopped container is gone: %v", err)
	}
	if info.State.Running || info.State.Status != container.StateExited {
		t.Fatalf("container state after Stop: %+v, want exited", info.State)
	}
	if got := rec.find(docker.RecordContainerStopped); len(got) != 1 || got[0]["container_id"] != sb.ID {
		t.Errorf("%s records %v, want one for %.12s", docker.RecordContainerStopped, got, sb.ID)
	}
	if again, err := b.Stop(ctx, spec.ConversationID, func() bool { t.Error("idle asked of a stopped container"); return true }); again || err != nil {
		t.Fatalf("a second Stop: %v, %v", again, err)
	}

	spec.RecordedID = sb.ID
	sb2, err := b.Ensure(ctx, spec)
	if err != nil {
		t.Fatalf("ensure after Stop: %v", err)
	}
	if sb2.ID != sb.ID || !sb2.Created {
		t.Fatalf("ensure after Stop = %+v, want the same container %.12s started again", sb2, sb.ID)
	}
	if got := volumesOf(t, cfg.Host, spec.ConversationID); len(got) != 1 || got[0].Name != vols[0].Name {
		t.Fatalf("workspace volumes %v after the wake, before %v", got, vols)
	}
	if _, err := sb2.Client().Settle(ctx, out1.act.ID); !errors.Is(err, sandbox.ErrUnknownActivation) {
		t.Fatalf("settle of the old activation after the wake: %v, want ErrUnknownActivation", err)
	}
	out2 := runTurn(t, ctx, sb2, spec.AgentCommand, "after the wake")
	if out2.act.NativeTurn != out1.result.NativeTurn || out2.result.NativeTurn != out1.result.NativeTurn+1 {
		t.Fatalf("after the wake: activation at %d, result at %d; before: result at %d",
			out2.act.NativeTurn, out2.result.NativeTurn, out1.result.NativeTurn)
	}
}

// S1: a container whose supervisor runs a turn is never stopped, whatever
// idle answers.
func TestDockerStopLeavesBusyContainer(t *testing.T) {
	b, _ := newBackend(t, nil)
	ctx := testCtx(t)
	spec, sb, _, _ := hangingTurn(t, ctx, b)
	stopped, err := b.Stop(ctx, spec.ConversationID, func() bool { return true })
	if stopped || !errors.Is(err, sandbox.ErrBusy) {
		t.Fatalf("Stop of a busy container: %v, %v; want ErrBusy", stopped, err)
	}
	info, err := env.engine.ContainerInspect(ctx, sb.ID)
	if err != nil || !info.State.Running {
		t.Fatalf("the busy container after Stop: %+v, %v", info.State, err)
	}
}
