package docker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/docker"
)

// pausedSandbox makes a conversation's container and freezes it (docker
// pause: the SIGTERM of a stop stays pending), and gives a backend over it
// a budget far too short for any stop: what the teardown then proves is
// only what the engine reports. It is unpaused when the test ends, before
// the sweep that removes it.
func pausedSandbox(t *testing.T, budget time.Duration) (*docker.Backend, context.Context, sandbox.Spec, sandbox.Sandbox) {
	t.Helper()
	_, cfg, ctx, spec, sb := ensured(t, nil)
	// A second value over the same host and state (the backend keeps
	// nothing in memory): a short probe, so the frozen supervisor's
	// silence costs little, and the budget under test.
	cfg.ProbeTimeout = 500 * time.Millisecond
	cfg.StopTimeout = 20 * time.Second
	cfg.TeardownBudget = budget
	b, err := docker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.engine.ContainerPause(ctx, sb.ID); err != nil {
		t.Fatalf("pause: %v", err)
	}
	t.Cleanup(func() { _ = env.engine.ContainerUnpause(context.Background(), sb.ID) })
	return b, ctx, spec, sb
}

// S6: an idle eviction's stop the engine cannot finish within the budget
// (the container is frozen, the budget a nanosecond) returns
// a TeardownIncomplete naming the container, which the engine still
// reports running.
func TestDockerStopNamesContainerNotStoppedInBudget(t *testing.T) {
	b, ctx, spec, sb := pausedSandbox(t, time.Nanosecond)
	stopped, err := b.Stop(ctx, spec.ConversationID, func() bool { return true })
	var ti *sandbox.TeardownIncomplete
	if !stopped || !errors.As(err, &ti) {
		t.Fatalf("Stop of a frozen container: %v, %v; want stopped with a TeardownIncomplete", stopped, err)
	}
	if ti.Container != sb.ID || ti.Budget != time.Nanosecond || len(ti.PIDs) != 0 {
		t.Fatalf("TeardownIncomplete %+v, want container %.12s and the budget", ti, sb.ID)
	}
	info, err := env.engine.ContainerInspect(ctx, sb.ID)
	if err != nil || !info.State.Running {
		t.Fatalf("the container named as surviving: %+v, %v", info.State, err)
	}
}

// S6: the same in a deletion: the container is named, and its workspace
// volume is kept for the next sweep rather than half-removed.
func TestDockerRemoveNamesContainerNotRemovedInBudget(t *testing.T) {
	b, ctx, spec, sb := pausedSandbox(t, time.Nanosecond)
	err := b.Remove(ctx, spec.ConversationID)
	var ti *sandbox.TeardownIncomplete
	if !errors.As(err, &ti) || ti.Container != sb.ID {
		t.Fatalf("Remove of a frozen container: %v; want a TeardownIncomplete naming %.12s", err, sb.ID)
	}
	if _, err := env.engine.ContainerInspect(ctx, sb.ID); err != nil {
		t.Fatalf("the container named as surviving: %v", err)
	}
}

// S6: a deletion during a turn whose agent ignores SIGTERM is proven: the
// engine reports the container gone when Remove returns nil.
func TestDockerRemoveProvesTurnGone(t *testing.T) {
	b, _ := newBackend(t, nil)
	ctx := testCtx(t)
	spec := newSpec(imgTestAgent)
	sb, err := b.Ensure(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	act, err := sb.Client().Activate(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	turn, err := sb.Client().Run(ctx, act.ID, spec.AgentCommand, "!ignoreterm !hang")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { turn.Close() })
	if ev, err := turn.Next(); err != nil || ev.Type != "turn.start" {
		t.Fatalf("first event = %+v, %v; want turn.start", ev, err)
	}
	if err := b.Remove(ctx, spec.ConversationID); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if _, err := env.engine.ContainerInspect(ctx, sb.ID); !isNotFound(err) {
		t.Fatalf("inspect after Remove: %v, want not found", err)
	}
}
