package docker_test

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"

	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/docker"
)

// R26/R31, issue 12 §8: the supervisor's record of the native turn
// boundary is out of the agent's reach. An agent that overwrites every file
// of its workspace — the previous release's .runnerd/native_turn included
// — and tries the supervisor's state directory and socket, can do the
// first and none of the rest; after a restart of the container the
// supervisor still reports the boundary it recorded, and so does the state
// file on the host.
func TestDockerAgentCannotChangeRecordedBoundary(t *testing.T) {
	b, cfg, ctx, spec, sb := ensured(t, nil, imgTestAgent)
	if out := runTurn(t, ctx, sb, spec.AgentCommand, "one"); out.result.NativeTurn != 1 {
		t.Fatalf("first turn ended at native turn %d, want 1", out.result.NativeTurn)
	}
	out := runTurn(t, ctx, sb, []string{imgTestAgent, "scribble"}, "scribble")
	if out.result.NativeTurn != 2 || out.receipt.NativeTurn != 2 {
		t.Fatalf("the scribbling turn ended at %d (receipt %d), want 2", out.result.NativeTurn, out.receipt.NativeTurn)
	}
	i := slices.IndexFunc(out.events, func(e sandbox.Event) bool { return e.Type == "scribbled" })
	if i < 0 {
		t.Fatalf("no scribbled event in %v", out.events)
	}
	var did struct {
		Overwritten     int  `json:"overwritten"`
		LegacyWritten   bool `json:"legacy_written"`
		StateListable   bool `json:"state_listable"`
		StateWritable   bool `json:"state_writable"`
		SocketReachable bool `json:"socket_reachable"`
	}
	if err := json.Unmarshal(out.events[i].Data, &did); err != nil {
		t.Fatal(err)
	}
	if did.Overwritten == 0 || !did.LegacyWritten {
		t.Fatalf("the agent did not scribble over its workspace (%+v): the test proves nothing", did)
	}
	if did.StateListable || did.StateWritable || did.SocketReachable {
		t.Errorf("the agent reached the supervisor's state or socket: %+v", did)
	}

	// A restarted supervisor reads its state again.
	secs := 1
	if err := env.engine.ContainerRestart(ctx, sb.ID, container.StopOptions{Timeout: &secs}); err != nil {
		t.Fatal(err)
	}
	sb2, err := b.Ensure(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if sb2.ID != sb.ID {
		t.Fatalf("ensure after the restart made a new container %.12s, want %.12s", sb2.ID, sb.ID)
	}
	st, err := sb2.Client().Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.NativeTurn != 2 {
		t.Fatalf("recorded native turn after the restart = %d, want 2 (the agent wrote 999 all over its workspace)", st.NativeTurn)
	}
	if n := hostStateFile(t, cfg); n != "2" {
		t.Fatalf("state file on the host holds %q, want 2", n)
	}
}

// A container of the previous release — no state mount, the supervisor's
// native turn in WORKSPACE/.runnerd — is replaced over the same workspace
// volume on the next Ensure, and its boundary moves to the state directory:
// the session continues from it, and the old file is gone from the agent's
// view.
func TestDockerPreviousLayoutIsMigrated(t *testing.T) {
	rec := &recorder{}
	b, cfg, ctx, spec, sb := ensured(t, func(c *docker.Config) { c.Logger = slog.New(rec) }, imgTestAgent)
	runTurn(t, ctx, sb, spec.AgentCommand, "one")
	info, err := env.engine.ContainerInspect(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	var vol, runDir string
	for _, m := range info.Mounts {
		switch m.Destination {
		case docker.DefaultWorkspace:
			vol = m.Name
		case "/.runnerd/run":
			runDir = m.Source
		}
	}
	v, err := env.engine.VolumeInspect(ctx, vol)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(v.Mountpoint); err != nil {
		t.Skipf("the workspace volume is not reachable from the test (engine on another host?): %v", err)
	}
	// Make it look like the previous release's: its state in the workspace
	// (native turn 5, not the 1 this release recorded), none outside, and
	// a container without the state mount in place of this one.
	if err := env.engine.ContainerRemove(ctx, sb.ID, container.RemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	legacy := filepath.Join(v.Mountpoint, ".runnerd", "native_turn")
	if err := os.MkdirAll(filepath.Dir(legacy), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(legacy, []byte("5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(hostStateDir(t, cfg)); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{}
	for k, val := range info.Config.Labels {
		if k != docker.LabelAgentUser {
			labels[k] = val
		}
	}
	old, err := env.engine.ContainerCreate(ctx, &container.Config{
		Image:      env.image,
		User:       "agent",
		WorkingDir: docker.DefaultWorkspace,
		Entrypoint: []string{"/.runnerd/bin/runnerd", "supervise", "--socket", "/.runnerd/run/supervisor.sock",
			"--workspace", docker.DefaultWorkspace, "--id", labels[docker.LabelInstance]},
		Labels: labels,
	}, &container.HostConfig{
		NetworkMode: "none",
		CapDrop:     []string{"ALL"},
		Mounts: []mount.Mount{
			{Type: mount.TypeBind, Source: env.runnerd, Target: "/.runnerd/bin/runnerd", ReadOnly: true},
			{Type: mount.TypeBind, Source: runDir, Target: "/.runnerd/run"},
			{Type: mount.TypeVolume, Source: vol, Target: docker.DefaultWorkspace},
		},
	}, nil, nil, info.Name)
	if err != nil {
		t.Fatal(err)
	}

	sb2, err := b.Ensure(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if sb2.ID == old.ID || !sb2.Created {
		t.Fatalf("ensure = %+v, want the previous release's container %.12s replaced", sb2, old.ID)
	}
	if cs := containersOf(t, cfg.Host, spec.ConversationID); len(cs) != 1 || cs[0].ID != sb2.ID {
		t.Fatalf("containers = %v, want only the new %.12s", cs, sb2.ID)
	}
	if r := rec.find(docker.RecordContainerReplaced); len(r) != 1 || r[0]["container_id"] != old.ID {
		t.Errorf("replaced records %v, want one for %.12s", r, old.ID)
	}
	if r := rec.find(docker.RecordStateAdopted); len(r) != 1 {
		t.Errorf("state adopted records %v, want one", r)
	}
	if n := hostStateFile(t, cfg); n != "5" {
		t.Fatalf("state file on the host holds %q, want the previous release's 5", n)
	}
	if _, err := os.Lstat(legacy); !os.IsNotExist(err) {
		t.Errorf("the previous release's state file is still in the workspace: %v", err)
	}
	if out := runTurn(t, ctx, sb2, []string{imgTestAgent, "scribble"}, "after"); out.act.NativeTurn != 5 || out.result.NativeTurn != 6 {
		t.Fatalf("turn after the migration went %d -> %d, want 5 -> 6", out.act.NativeTurn, out.result.NativeTurn)
	}
}

// hostStateDir is the one conversation's state directory under the
// backend's state directory.
func hostStateDir(t *testing.T, cfg docker.Config) string {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join(cfg.StateDir, "docker", "*", "state"))
	if err != nil || len(dirs) != 1 {
		t.Fatalf("state directories %v (%v), want one", dirs, err)
	}
	return dirs[0]
}

func hostStateFile(t *testing.T, cfg docker.Config) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(hostStateDir(t, cfg), sandbox.NativeTurnFile))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// What an agent of this release writes where the previous release kept
// the boundary is never taken for one: a new container's supervisor writes
// its state at once, so a container made anew over the volume adopts
// nothing — even when no turn had ended yet.
func TestDockerAgentWrittenLegacyFileIsNeverAdopted(t *testing.T) {
	b, _, ctx, spec, sb := ensured(t, nil, imgTestAgent)
	info, err := env.engine.ContainerInspect(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	var vol string
	for _, m := range info.Mounts {
		if m.Destination == docker.DefaultWorkspace {
			vol = m.Name
		}
	}
	v, err := env.engine.VolumeInspect(ctx, vol)
	if err != nil {
		t.Fatal(err)
	}
	legacy := filepath.Join(v.Mountpoint, ".runnerd", "native_turn")
	if err := os.MkdirAll(filepath.Dir(legacy), 0o755); err != nil {
		t.Skipf("the workspace volume is not reachable from the test: %v", err)
	}
	if err := os.WriteFile(legacy, []byte("999\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := env.engine.ContainerRemove(ctx, sb.ID, container.RemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	sb2, err := b.Ensure(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if sb2.ID == sb.ID {
		t.Fatal("no new container over the volume")
	}
	if st, err := sb2.Client().Status(ctx); err != nil || st.NativeTurn != 0 {
		t.Fatalf("status of the new container %+v, %v; want native turn 0, not the agent's 999", st, err)
	}
}
