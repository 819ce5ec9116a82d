package docker_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/docker"
	"github.com/runnerd/runnerd/wire"
)

func newSpec(agent ...string) sandbox.Spec {
	if len(agent) == 0 {
		agent = env.agent
	}
	return sandbox.Spec{ConversationID: "conv-" + randHex(4), Image: env.image, AgentCommand: agent}
}

// testCtx bounds one test's engine and supervisor calls, so that a hang is
// a failure and not a stuck run.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// ensured is the common start of a test: a backend of its own (modified by
// modify, if not nil), a conversation running agent (the demo agent if
// none is given), and its sandbox, made.
func ensured(t *testing.T, modify func(*docker.Config), agent ...string) (*docker.Backend, docker.Config, context.Context, sandbox.Spec, sandbox.Sandbox) {
	t.Helper()
	b, cfg := newBackend(t, modify)
	ctx := testCtx(t)
	spec := newSpec(agent...)
	sb, err := b.Ensure(ctx, spec)
	if err != nil {
		t.Fatalf("ensure: %v", err)
	}
	return b, cfg, ctx, spec, sb
}

type turnOut struct {
	act     sandbox.Activation
	events  []sandbox.Event
	result  sandbox.Result
	receipt wire.SupervisorReceipt
}

// runTurn drives one whole turn through the supervisor in sb: activate,
// run the prompt, read the stream to its end, settle.
func runTurn(t testing.TB, ctx context.Context, sb sandbox.Sandbox, command []string, prompt string) turnOut {
	t.Helper()
	c := sb.Client()
	var out turnOut
	var err error
	if out.act, err = c.Activate(ctx, 0); err != nil {
		t.Fatalf("activate: %v", err)
	}
	turn, err := c.Run(ctx, out.act.ID, command, prompt)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	defer turn.Close()
	for {
		ev, err := turn.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("turn stream: %v (events so far: %v)", err, out.events)
		}
		out.events = append(out.events, ev)
	}
	if out.result, err = turn.Result(); err != nil {
		t.Fatalf("result: %v", err)
	}
	if out.receipt, err = c.Settle(ctx, out.act.ID); err != nil {
		t.Fatalf("settle: %v", err)
	}
	return out
}

// R29: the retained container's identity is found again by labels, is the
// one Ensure reports (and the runner records before admission), and stays
// the same across turns and across a fresh Backend (a daemon restart); the
// native turn ordinal continues.
func TestDockerTurnReusesRetainedContainer(t *testing.T) {
	b, cfg := newBackend(t, nil)
	ctx := testCtx(t)
	spec := newSpec()
	if err := b.Preflight(ctx, spec); err != nil {
		t.Fatalf("preflight of a new conversation: %v", err)
	}
	sb1, err := b.Ensure(ctx, spec)
	if err != nil {
		t.Fatalf("ensure: %v", err)
	}
	if !sb1.Created || sb1.Backend != sandbox.BackendDocker || sb1.ID == "" {
		t.Fatalf("first ensure = %+v, want a created docker sandbox with an id", sb1)
	}
	cs := containersOf(t, cfg.Host, spec.ConversationID)
	if len(cs) != 1 || cs[0].ID != sb1.ID {
		t.Fatalf("containers labelled for the conversation = %v, want exactly %.12s", cs, sb1.ID)
	}
	if got := cs[0].Labels[docker.LabelManaged]; got != "true" {
		t.Errorf("label %s = %q, want true", docker.LabelManaged, got)
	}

	out1 := runTurn(t, ctx, sb1, spec.AgentCommand, "hello")
	if out1.result.ExitCode != 0 || out1.result.NativeTurn != 1 {
		t.Fatalf("turn 1 result = %+v, want exit 0 at native turn 1", out1.result)
	}
	if out1.receipt.ActivationID != out1.act.ID || out1.receipt.NativeTurn != 1 {
		t.Fatalf("turn 1 receipt = %+v, want activation %s at native turn 1", out1.receipt, out1.act.ID)
	}
	again, err := sb1.Client().Settle(ctx, out1.act.ID)
	if err != nil || again != out1.receipt {
		t.Fatalf("settle again = %+v, %v; want the same receipt %+v (R26)", again, err, out1.receipt)
	}

	spec.RecordedID = sb1.ID
	if err := b.Preflight(ctx, spec); err != nil {
		t.Fatalf("preflight with a retained container: %v", err)
	}
	sb2, err := b.Ensure(ctx, spec)
	if err != nil {
		t.Fatalf("second ensure: %v", err)
	}
	if sb2.ID != sb1.ID || sb2.Created {
		t.Fatalf("second ensure = %+v, want the retained %.12s, not created", sb2, sb1.ID)
	}
	out2 := runTurn(t, ctx, sb2, spec.AgentCommand, "again")
	if out2.act.NativeTurn != 1 || out2.result.NativeTurn != 2 || out2.receipt.NativeTurn != 2 {
		t.Fatalf("turn 2: activation at %d, result %+v, receipt %+v; want it to start at 1 and end at 2",
			out2.act.NativeTurn, out2.result, out2.receipt)
	}

	// A fresh backend value (the daemon restarted) finds the same container.
	fresh, err := docker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sb3, err := fresh.Ensure(ctx, spec)
	if err != nil || sb3.ID != sb1.ID || sb3.Created {
		t.Fatalf("ensure from a fresh backend = %+v, %v; want the retained %.12s", sb3, err, sb1.ID)
	}
	if n := len(volumesOf(t, cfg.Host, spec.ConversationID)); n != 1 {
		t.Fatalf("%d workspace volumes, want 1", n)
	}
}

// A missing container at the next turn of a usable conversation is made
// anew over the workspace volume, and the native session continues.
func TestDockerMissingContainerRecreatedFromVolume(t *testing.T) {
	b, cfg, ctx, spec, sb1 := ensured(t, nil)
	if out := runTurn(t, ctx, sb1, spec.AgentCommand, "one"); out.result.NativeTurn != 1 {
		t.Fatalf("turn 1 ended at native turn %d, want 1", out.result.NativeTurn)
	}
	if err := env.engine.ContainerRemove(ctx, sb1.ID, container.RemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	if err := b.Alive(ctx, sb1); !errors.Is(err, docker.ErrSandboxGone) {
		t.Fatalf("alive after removal = %v, want ErrSandboxGone", err)
	}
	spec.RecordedID = sb1.ID
	if err := b.Preflight(ctx, spec); err != nil {
		t.Fatalf("preflight with the container gone: %v", err)
	}
	sb2, err := b.Ensure(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if sb2.ID == sb1.ID || !sb2.Created {
		t.Fatalf("ensure after loss = %+v, want a new container", sb2)
	}
	if cs := containersOf(t, cfg.Host, spec.ConversationID); len(cs) != 1 || cs[0].ID != sb2.ID {
		t.Fatalf("containers = %v, want exactly the new %.12s", cs, sb2.ID)
	}
	out := runTurn(t, ctx, sb2, spec.AgentCommand, "two")
	if out.act.NativeTurn != 1 || out.result.NativeTurn != 2 {
		t.Fatalf("turn 2 started at %d and ended at %d, want 1 and 2: the session must continue from the volume",
			out.act.NativeTurn, out.result.NativeTurn)
	}
}

// A conversation the control plane has a sandbox for, whose workspace
// volume is not on this host, is refused rather than silently started
// empty; nothing is created.
func TestDockerWorkspaceLostIsRefused(t *testing.T) {
	b, cfg := newBackend(t, nil)
	ctx := testCtx(t)
	spec := newSpec()
	spec.RecordedID = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	_, err := b.Ensure(ctx, spec)
	if !errors.Is(err, sandbox.ErrWorkspaceLost) {
		t.Fatalf("ensure = %v, want ErrWorkspaceLost", err)
	}
	if cs, vs := containersOf(t, cfg.Host, ""), volumesOf(t, cfg.Host, ""); len(cs)+len(vs) != 0 {
		t.Fatalf("created %d containers and %d volumes, want none", len(cs), len(vs))
	}
}

// R33: a failed read-only preflight declines with its class and creates,
// starts and changes nothing: no container, no volume, not even the state
// directory's docker/ subdirectory.
func TestDockerPreflightDeclinesAndCreatesNothing(t *testing.T) {
	unreachable, err := client.NewClientWithOpts(client.WithHost("unix:///nonexistent/docker.sock"), client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer unreachable.Close()
	tests := []struct {
		name   string
		modify func(*docker.Config)
		spec   func(*sandbox.Spec)
		class  string
	}{
		{name: "image missing, pull never", modify: func(c *docker.Config) { c.Pull = docker.PullNever },
			spec: func(s *sandbox.Spec) { s.Image = "runnerd-test/missing:" + randHex(4) }, class: sandbox.ClassImageUnavailable},
		{name: "image reference invalid", spec: func(s *sandbox.Spec) { s.Image = "Not A/Reference!" }, class: sandbox.ClassImageUnavailable},
		{name: "network missing", modify: func(c *docker.Config) { c.Network = "runnerd-test-nonet-" + randHex(4) }, class: sandbox.ClassNetworkMissing},
		{name: "engine unreachable", modify: func(c *docker.Config) { c.Engine = unreachable }, class: sandbox.ClassEngineUnreachable},
		{name: "runnerd binary missing", modify: func(c *docker.Config) { c.RunnerdPath = "/nonexistent/runnerd" }, class: sandbox.ClassSupervisorMissing},
		{name: "agent command empty", spec: func(s *sandbox.Spec) { s.AgentCommand = nil }, class: sandbox.ClassAgentMissing},
		{name: "conversation id empty", spec: func(s *sandbox.Spec) { s.ConversationID = "" }, class: sandbox.ClassInvalidSpec},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, cfg := newBackend(t, tt.modify)
			ctx := testCtx(t)
			spec := newSpec()
			if tt.spec != nil {
				tt.spec(&spec)
			}
			err := b.Preflight(ctx, spec)
			var pe *sandbox.PreflightError
			if !errors.As(err, &pe) || pe.Class != tt.class {
				t.Fatalf("preflight = %v, want a PreflightError of class %s", err, tt.class)
			}
			if cs, vs := containersOf(t, cfg.Host, ""), volumesOf(t, cfg.Host, ""); len(cs)+len(vs) != 0 {
				t.Fatalf("preflight created %d containers and %d volumes", len(cs), len(vs))
			}
			if ents, err := os.ReadDir(cfg.StateDir); err != nil || len(ents) != 0 {
				t.Fatalf("state directory after preflight: %v, %v; want it untouched", ents, err)
			}
		})
	}
}

// hangingTurn makes a conversation's sandbox and starts a turn in it whose
// agent never ends, returning once the agent has spoken.
func hangingTurn(t *testing.T, ctx context.Context, b *docker.Backend) (sandbox.Spec, sandbox.Sandbox, sandbox.Activation, *sandbox.Turn) {
	t.Helper()
	spec := newSpec(imgTestAgent)
	sb, err := b.Ensure(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	act, err := sb.Client().Activate(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	turn, err := sb.Client().Run(ctx, act.ID, spec.AgentCommand, "work forever !hang")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { turn.Close() })
	if ev, err := turn.Next(); err != nil || ev.Type != "turn.start" {
		t.Fatalf("first event = %+v, %v; want turn.start", ev, err)
	}
	return spec, sb, act, turn
}

// streamEnd reads a turn's stream to its end and returns what ended it.
func streamEnd(turn *sandbox.Turn) error {
	for {
		if _, err := turn.Next(); err != nil {
			return err
		}
	}
}

// R35: the container killed mid-turn fails the turn closed: the stream ends
// with ErrInterrupted, there is no receipt, the backend says the sandbox is
// gone; the next Ensure restarts the container, whose fresh supervisor
// knows no earlier activation (R28), so the killed turn can never be
// confirmed as settled.
func TestDockerContainerKilledMidTurnFailsClosed(t *testing.T) {
	b, _ := newBackend(t, nil)
	ctx := testCtx(t)
	spec, sb, act, turn := hangingTurn(t, ctx, b)
	c := sb.Client()
	if err := env.engine.ContainerKill(ctx, sb.ID, "KILL"); err != nil {
		t.Fatal(err)
	}
	err := streamEnd(turn)
	if !errors.Is(err, sandbox.ErrInterrupted) {
		t.Fatalf("stream after the kill ended with %v, want ErrInterrupted", err)
	}
	if _, err := turn.Result(); err == nil {
		t.Fatal("a killed turn has a result")
	}
	if err := b.Alive(ctx, sb); !errors.Is(err, docker.ErrSandboxGone) {
		t.Fatalf("alive after the kill = %v, want ErrSandboxGone", err)
	}
	if r, err := c.Settle(ctx, act.ID); !errors.Is(err, sandbox.ErrUnavailable) {
		t.Fatalf("settle after the kill = %+v, %v; want ErrUnavailable and no receipt", r, err)
	}

	sb2, err := b.Ensure(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if sb2.ID != sb.ID || !sb2.Created {
		t.Fatalf("ensure after the kill = %+v, want %.12s restarted", sb2, sb.ID)
	}
	if r, err := sb2.Client().Settle(ctx, act.ID); !errors.Is(err, sandbox.ErrUnknownActivation) {
		t.Fatalf("settle through the restarted supervisor = %+v, %v; want ErrUnknownActivation (R28)", r, err)
	}
}

// Two activations of one container: the older token is refused, and a turn
// it was running is stopped.
func TestDockerOlderActivationRefused(t *testing.T) {
	b, _ := newBackend(t, nil)
	ctx := testCtx(t)
	spec, sb, older, turn := hangingTurn(t, ctx, b)
	c := sb.Client()
	newer, err := c.Activate(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if newer.ID == older.ID {
		t.Fatal("two activations got the same token")
	}
	if err := streamEnd(turn); !errors.Is(err, sandbox.ErrFenced) && !errors.Is(err, sandbox.ErrInterrupted) {
		t.Fatalf("older turn after a newer activation ended with %v, want fenced or interrupted", err)
	}
	if _, err := c.Run(ctx, older.ID, spec.AgentCommand, "again"); !errors.Is(err, sandbox.ErrFenced) {
		t.Fatalf("run with the older token = %v, want ErrFenced", err)
	}
	if _, err := c.Settle(ctx, older.ID); !errors.Is(err, sandbox.ErrFenced) {
		t.Fatalf("settle with the older token = %v, want ErrFenced", err)
	}
	// The newer token owns the container and runs a whole turn.
	t2, err := c.Run(ctx, newer.ID, spec.AgentCommand, "fine")
	if err != nil {
		t.Fatal(err)
	}
	defer t2.Close()
	if err := streamEnd(t2); err != io.EOF {
		t.Fatalf("newer turn ended with %v, want a completed stream", err)
	}
	if _, err := c.Settle(ctx, newer.ID); err != nil {
		t.Fatalf("settle with the newer token: %v", err)
	}
}

// The security defaults are in force: as the engine reports them, and as
// the agent inside experiences them.
func TestDockerSecurityDefaults(t *testing.T) {
	_, _, ctx, spec, sb := ensured(t, nil, imgTestAgent, "probe")
	info, err := env.engine.ContainerInspect(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	hc := info.HostConfig
	// The supervisor runs as root with only what it needs to start and stop
	// agents as the image's user (and so keep its state out of their reach).
	if capAdd := slices.Sorted(slices.Values(hc.CapAdd)); !slices.Equal([]string(hc.CapDrop), []string{"ALL"}) ||
		!slices.Equal(capAdd, []string{"CAP_KILL", "CAP_SETGID", "CAP_SETUID"}) {
		t.Errorf("CapDrop %v, CapAdd %v; want ALL dropped, only KILL, SETGID and SETUID added", hc.CapDrop, hc.CapAdd)
	}
	if info.Config.User != "0:0" || info.Config.Labels[docker.LabelAgentUser] != "agent" {
		t.Errorf("container user %q, agent user %q; want the supervisor as 0:0 and the agents as the image's user",
			info.Config.User, info.Config.Labels[docker.LabelAgentUser])
	}
	if !slices.Contains(hc.SecurityOpt, "no-new-privileges:true") {
		t.Errorf("SecurityOpt %v lacks no-new-privileges", hc.SecurityOpt)
	}
	if hc.NetworkMode != "none" {
		t.Errorf("NetworkMode %q, want none", hc.NetworkMode)
	}
	if hc.PidsLimit == nil || *hc.PidsLimit != docker.DefaultPidsLimit {
		t.Errorf("PidsLimit %v, want %d", hc.PidsLimit, docker.DefaultPidsLimit)
	}
	if hc.Memory != docker.DefaultMemoryBytes || hc.NanoCPUs != docker.DefaultNanoCPUs {
		t.Errorf("Memory %d, NanoCPUs %d; want %d and %d", hc.Memory, hc.NanoCPUs, docker.DefaultMemoryBytes, docker.DefaultNanoCPUs)
	}
	if !hc.ReadonlyRootfs {
		t.Error("root filesystem is writable")
	}
	if hc.Privileged {
		t.Error("container is privileged")
	}
	for _, m := range info.Mounts {
		if m.Destination == "/.runnerd/bin/runnerd" && m.RW {
			t.Error("the runnerd binary is mounted writable")
		}
	}

	out := runTurn(t, ctx, sb, spec.AgentCommand, "probe")
	var probe struct {
		CapEff       string   `json:"cap_eff"`
		CapBnd       string   `json:"cap_bnd"`
		NoNewPrivs   string   `json:"no_new_privs"`
		UID          int      `json:"uid"`
		RootWritable bool     `json:"root_writable"`
		Interfaces   []string `json:"interfaces"`
	}
	i := slices.IndexFunc(out.events, func(e sandbox.Event) bool { return e.Type == "probe" })
	if i < 0 {
		t.Fatalf("no probe event in %v", out.events)
	}
	if err := json.Unmarshal(out.events[i].Data, &probe); err != nil {
		t.Fatal(err)
	}
	// None effective; the bounding set keeps the supervisor's three, which
	// no_new_privs keeps the agent from ever gaining.
	if probe.CapEff != "0000000000000000" || probe.CapBnd != "00000000000000e0" {
		t.Errorf("agent capabilities eff=%s bnd=%s, want none effective, only KILL, SETGID, SETUID bounding", probe.CapEff, probe.CapBnd)
	}
	if probe.NoNewPrivs != "1" {
		t.Errorf("agent NoNewPrivs = %q, want 1", probe.NoNewPrivs)
	}
	if probe.UID != 4242 {
		t.Errorf("agent uid %d, want the image's non-root user agent (4242)", probe.UID)
	}
	if probe.RootWritable {
		t.Error("agent could write to /")
	}
	if !slices.Equal(probe.Interfaces, []string{"lo"}) {
		t.Errorf("agent network interfaces %v, want only lo", probe.Interfaces)
	}
}

// Every security default is a Config field, and the fields reach the engine.
func TestDockerSecurityOverrides(t *testing.T) {
	b, _ := newBackend(t, func(c *docker.Config) {
		c.Network = "bridge"
		c.PidsLimit = 64
		c.MemoryBytes = 256 << 20
		c.NanoCPUs = 500_000_000
		c.AllowNewPrivileges = true
		c.CapAdd = []string{"CAP_CHOWN"}
		c.WritableRootFS = true
		c.User = "1234:1234" // not the image's agent
	})
	ctx := testCtx(t)
	sb, err := b.Ensure(ctx, newSpec(imgTestAgent))
	if err != nil {
		t.Fatal(err)
	}
	info, err := env.engine.ContainerInspect(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	hc := info.HostConfig
	agentUser := info.Config.Labels[docker.LabelAgentUser]
	if hc.NetworkMode != "bridge" || *hc.PidsLimit != 64 || hc.Memory != 256<<20 || hc.NanoCPUs != 500_000_000 ||
		slices.Contains(hc.SecurityOpt, "no-new-privileges:true") || !slices.Contains(hc.CapAdd, "CAP_CHOWN") ||
		hc.ReadonlyRootfs || agentUser != "1234:1234" {
		t.Fatalf("overrides not applied: network %s pids %v memory %d cpus %d secopt %v capadd %v ro %v agent user %q",
			hc.NetworkMode, *hc.PidsLimit, hc.Memory, hc.NanoCPUs, hc.SecurityOpt, hc.CapAdd, hc.ReadonlyRootfs, agentUser)
	}
}

// A container's log is capped by default (json-file, rotated at 10 MiB, three
// files), the caps are Config fields, and a negative size leaves the log to
// the engine's own configuration — as the engine reports each container.
func TestDockerContainerLogCapped(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*docker.Config)
		want   container.LogConfig
	}{
		{"default", nil, container.LogConfig{Type: "json-file", Config: map[string]string{"max-size": "10485760", "max-file": "3"}}},
		{"configured", func(c *docker.Config) { c.LogMaxBytes, c.LogMaxFiles = 1<<20, 5 },
			container.LogConfig{Type: "json-file", Config: map[string]string{"max-size": "1048576", "max-file": "5"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, _ := newBackend(t, tt.modify)
			ctx := testCtx(t)
			sb, err := b.Ensure(ctx, newSpec(imgTestAgent))
			if err != nil {
				t.Fatal(err)
			}
			info, err := env.engine.ContainerInspect(ctx, sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got := info.HostConfig.LogConfig; got.Type != tt.want.Type || !maps.Equal(got.Config, tt.want.Config) {
				t.Fatalf("LogConfig %+v, want %+v", got, tt.want)
			}
		})
	}
	t.Run("engine default", func(t *testing.T) {
		b, _ := newBackend(t, func(c *docker.Config) { c.LogMaxBytes = -1 })
		ctx := testCtx(t)
		sb, err := b.Ensure(ctx, newSpec(imgTestAgent))
		if err != nil {
			t.Fatal(err)
		}
		info, err := env.engine.ContainerInspect(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		engine, err := env.engine.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := info.HostConfig.LogConfig; got.Type != engine.LoggingDriver || got.Config["max-size"] == "10485760" {
			t.Fatalf("LogConfig %+v, want the engine's default driver %q , not our cap", got, engine.LoggingDriver)
		}
	})
}

type recorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.records = append(r.records, rec.Clone())
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }

func (r *recorder) find(msg string) []map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []map[string]string
	for _, rec := range r.records {
		if rec.Message != msg {
			continue
		}
		m := map[string]string{}
		rec.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
		out = append(out, m)
	}
	return out
}

// The sweep removes the sandboxes of the conversations the runner names,
// with a record, and nothing else: not the other conversations of this
// host, not another host's sandbox of the same conversation, not a
// container this host did not create.
func TestDockerSweepRemovesOnlyChosenAndOnlyOurs(t *testing.T) {
	rec := &recorder{}
	a, cfgA := newBackend(t, func(c *docker.Config) { c.Logger = slog.New(rec) })
	other, cfgB := newBackend(t, nil)
	ctx := testCtx(t)
	lost, kept := newSpec(imgTestAgent), newSpec(imgTestAgent)

	// A container someone else made, carrying our host and conversation
	// labels but not runnerd.managed. It is created, never started.
	foreign, err := env.engine.ContainerCreate(ctx, &container.Config{
		Image:      env.image,
		Entrypoint: []string{imgTestAgent},
		Labels:     map[string]string{docker.LabelHost: cfgA.Host, docker.LabelConversation: lost.ConversationID},
	}, &container.HostConfig{NetworkMode: "none"}, nil, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.engine.ContainerRemove(context.Background(), foreign.ID, container.RemoveOptions{Force: true})
	})

	sbLost, err := a.Ensure(ctx, lost)
	if err != nil {
		t.Fatal(err)
	}
	if sbLost.ID == foreign.ID {
		t.Fatal("ensure adopted a container this host did not create")
	}
	if _, err := a.Ensure(ctx, kept); err != nil {
		t.Fatal(err)
	}
	sbOther, err := other.Ensure(ctx, lost)
	if err != nil {
		t.Fatal(err)
	}

	res, err := a.Sweep(ctx, func(conv string) bool { return conv == lost.ConversationID })
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Removed, []string{lost.ConversationID}) || res.Kept != 1 {
		t.Fatalf("sweep = %+v, want %s removed and 1 kept", res, lost.ConversationID)
	}
	if _, err := env.engine.ContainerInspect(ctx, sbLost.ID); !isNotFound(err) {
		t.Errorf("swept container still there (inspect: %v)", err)
	}
	var managedLeft int
	for _, c := range containersOf(t, cfgA.Host, lost.ConversationID) {
		if c.ID != foreign.ID {
			managedLeft++
		}
	}
	if managedLeft != 0 || len(volumesOf(t, cfgA.Host, lost.ConversationID)) != 0 {
		t.Errorf("sweep left %d containers and some volume of the swept conversation", managedLeft)
	}
	if _, err := env.engine.ContainerInspect(ctx, foreign.ID); err != nil {
		t.Errorf("the foreign container is gone: %v", err)
	}
	if _, err := env.engine.ContainerInspect(ctx, sbOther.ID); err != nil {
		t.Errorf("another host's container is gone: %v", err)
	}
	if n := len(containersOf(t, cfgA.Host, kept.ConversationID)); n != 1 {
		t.Errorf("kept conversation has %d containers, want 1", n)
	}
	if len(volumesOf(t, cfgB.Host, lost.ConversationID)) != 1 {
		t.Error("another host's workspace volume is gone")
	}
	recs := rec.find(docker.RecordSwept)
	if len(recs) != 1 || recs[0]["conversation_id"] != lost.ConversationID || recs[0]["container_id"] != sbLost.ID {
		t.Fatalf("sweep records = %v, want one for %s with container %.12s", recs, lost.ConversationID, sbLost.ID)
	}

	// Remove of a conversation also leaves the foreign container alone.
	if err := a.Remove(ctx, lost.ConversationID); err != nil {
		t.Fatal(err)
	}
	if _, err := env.engine.ContainerInspect(ctx, foreign.ID); err != nil {
		t.Errorf("remove took the foreign container: %v", err)
	}
}

// R33: preflight starts nothing either: a stopped retained container stays
// stopped, untouched, and preflight still passes (Ensure restarts it later).
func TestDockerPreflightLeavesStoppedContainerStopped(t *testing.T) {
	b, cfg, ctx, spec, sb := ensured(t, nil)
	timeout := 5
	if err := env.engine.ContainerStop(ctx, sb.ID, container.StopOptions{Timeout: &timeout}); err != nil {
		t.Fatal(err)
	}
	before, err := env.engine.ContainerInspect(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	spec.RecordedID = sb.ID
	if err := b.Preflight(ctx, spec); err != nil {
		t.Fatalf("preflight with a stopped retained container: %v", err)
	}
	after, err := env.engine.ContainerInspect(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if after.State.Running || after.State.StartedAt != before.State.StartedAt || after.RestartCount != before.RestartCount {
		t.Fatalf("preflight changed the container: state %+v, was %+v", after.State, before.State)
	}
	if n := len(containersOf(t, cfg.Host, "")); n != 1 {
		t.Fatalf("%d containers after preflight, want the 1 retained", n)
	}
	sb2, err := b.Ensure(ctx, spec)
	if err != nil || sb2.ID != sb.ID || !sb2.Created {
		t.Fatalf("ensure of the stopped container = %+v, %v; want %.12s started again", sb2, err, sb.ID)
	}
}

// Two turn children racing to make one conversation's sandbox (two
// Backend values, as two processes would have) end up with one container.
func TestDockerConcurrentEnsureMakesOneContainer(t *testing.T) {
	b1, cfg := newBackend(t, nil)
	b2, err := docker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	spec := newSpec()
	var wg sync.WaitGroup
	ids := make([]string, 2)
	errs := make([]error, 2)
	for i, b := range []*docker.Backend{b1, b2} {
		wg.Go(func() {
			sb, err := b.Ensure(ctx, spec)
			ids[i], errs[i] = sb.ID, err
		})
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("ensure errors: %v, %v", errs[0], errs[1])
	}
	if ids[0] != ids[1] {
		t.Fatalf("two ensures made two sandboxes %.12s and %.12s", ids[0], ids[1])
	}
	if cs, vs := containersOf(t, cfg.Host, ""), volumesOf(t, cfg.Host, ""); len(cs) != 1 || len(vs) != 1 {
		t.Fatalf("%d containers and %d volumes, want 1 and 1", len(cs), len(vs))
	}
}

// A running container whose supervisor does not answer (here: stopped
// with SIGSTOP) is taken for hung and restarted over the same workspace;
// the identity stays, the native session continues, and old activations
// are unknown to the new supervisor (R28).
func TestDockerUnresponsiveSupervisorIsRestarted(t *testing.T) {
	rec := &recorder{}
	b, _, ctx, spec, sb := ensured(t, func(c *docker.Config) {
		c.ProbeTimeout = 500 * time.Millisecond
		c.Logger = slog.New(rec)
	})
	out := runTurn(t, ctx, sb, spec.AgentCommand, "one")
	top, err := env.engine.ContainerTop(ctx, sb.ID, []string{"-o", "pid,args"})
	if err != nil {
		t.Fatal(err)
	}
	pid := 0
	for _, p := range top.Processes {
		if len(p) == 2 && strings.Contains(p[1], " supervise ") {
			pid, _ = strconv.Atoi(p[0])
		}
	}
	if pid == 0 {
		t.Fatalf("no supervisor among the container's processes %v", top.Processes)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Skipf("cannot stop the supervisor from the test (engine on another host?): %v", err)
	}
	// The signal is delivered to each thread in its time: a thread not yet
	// stopped could still answer the probe below.
	if err := fleet.FreezeProcess(pid, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	sb2, err := b.Ensure(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if sb2.ID != sb.ID || !sb2.Created {
		t.Fatalf("ensure = %+v, want %.12s restarted", sb2, sb.ID)
	}
	if recs := rec.find(docker.RecordContainerRestart); len(recs) != 1 || recs[0]["class"] != "supervisor_unresponsive" {
		t.Fatalf("restart records = %v", recs)
	}
	if _, err := sb2.Client().Settle(ctx, out.act.ID); !errors.Is(err, sandbox.ErrUnknownActivation) {
		t.Fatalf("settle of the old activation = %v, want ErrUnknownActivation", err)
	}
	if out2 := runTurn(t, ctx, sb2, spec.AgentCommand, "two"); out2.result.NativeTurn != 2 {
		t.Fatalf("turn after the restart ended at native turn %d, want 2", out2.result.NativeTurn)
	}
}

// The host never dials a path the container can change. The agent shares
// the supervisor's uid, so it can replace the socket in the bind-mounted
// run directory, e.g. by a symlink to another conversation's socket. The
// host dials only its private link to the socket inode the supervisor
// bound: a lost private link to the real socket is made again, the decoy
// gets no connection, the turn goes to the real supervisor, and with the
// private link lost too the symlink is not adopted.
func TestDockerHostNeverDialsTheSharedSocketPath(t *testing.T) {
	b, _, ctx, spec, sb := ensured(t, func(c *docker.Config) { c.ProbeTimeout = 500 * time.Millisecond })
	bound := filepath.Join(filepath.Dir(sb.Socket), "run", "supervisor.sock")
	if fi, err := os.Lstat(bound); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("the supervisor's bound socket %s: %v, %v", bound, fi, err)
	}
	// A lost private link to a real socket is simply made again.
	if err := os.Remove(sb.Socket); err != nil {
		t.Fatal(err)
	}
	if sb1, err := b.Ensure(ctx, spec); err != nil || sb1.ID != sb.ID || sb1.Created {
		t.Fatalf("ensure with the private link lost = %+v, %v; want the running %.12s, untouched", sb1, err, sb.ID)
	}

	decoyPath := filepath.Join(t.TempDir(), "decoy.sock")
	decoy, err := net.Listen("unix", decoyPath)
	if err != nil {
		t.Fatal(err)
	}
	defer decoy.Close()
	dialed := make(chan struct{}, 1)
	acceptDone := make(chan struct{})
	go func() {
		defer close(acceptDone)
		if c, err := decoy.Accept(); err == nil {
			dialed <- struct{}{}
			c.Close()
		}
	}()
	if err := os.Remove(bound); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(decoyPath, bound); err != nil {
		t.Fatal(err)
	}

	sb2, err := b.Ensure(ctx, spec)
	if err != nil || sb2.ID != sb.ID || sb2.Created {
		t.Fatalf("ensure = %+v, %v; want the running %.12s, untouched", sb2, err, sb.ID)
	}
	if out := runTurn(t, ctx, sb2, spec.AgentCommand, "hi"); out.result.NativeTurn != 1 {
		t.Fatalf("turn ended at native turn %d, want 1", out.result.NativeTurn)
	}
	// The private link lost: Ensure must not adopt the symlink.
	if err := os.Remove(sb.Socket); err != nil {
		t.Fatal(err)
	}
	// Not adoptable, so the supervisor is taken for unresponsive and its
	// container restarted, which clears the run directory.
	sb3, err := b.Ensure(ctx, spec)
	if err != nil || sb3.ID != sb.ID || !sb3.Created {
		t.Fatalf("ensure with only the symlink in place = %+v, %v; want %.12s restarted", sb3, err, sb.ID)
	}
	decoy.Close()
	<-acceptDone
	select {
	case <-dialed:
		t.Fatal("the host dialed the symlinked decoy socket")
	default:
	}
}

// A container an earlier Ensure created but never started (it stopped in
// between, before handing the fresh workspace volume to the image's user)
// is prepared and started by the next Ensure.
func TestDockerCreatedButNeverStartedContainerIsStarted(t *testing.T) {
	b, cfg, ctx, spec, sb := ensured(t, nil)
	info, err := env.engine.ContainerInspect(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	// Put the same container back as created-only, over a workspace that
	// belongs to root again, as a crash right after create would leave it.
	if err := env.engine.ContainerRemove(ctx, sb.ID, container.RemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	vs := volumesOf(t, cfg.Host, spec.ConversationID)
	if len(vs) != 1 {
		t.Fatalf("%d volumes, want 1", len(vs))
	}
	if err := os.Lchown(vs[0].Mountpoint, 0, 0); err != nil {
		t.Skipf("cannot reach the volume's mount point from the test (remote engine?): %v", err)
	}
	created, err := env.engine.ContainerCreate(ctx, info.Config, info.HostConfig, nil, nil, info.Name)
	if err != nil {
		t.Fatal(err)
	}
	sb2, err := b.Ensure(ctx, spec)
	if err != nil {
		t.Fatalf("ensure of a created-only container: %v", err)
	}
	if sb2.ID != created.ID || !sb2.Created {
		t.Fatalf("ensure = %+v, want %.12s started", sb2, created.ID)
	}
	if out := runTurn(t, ctx, sb2, spec.AgentCommand, "hi"); out.result.ExitCode != 0 {
		t.Fatalf("turn result %+v", out.result)
	}
}

// Issue 7: the runner's sweep lists this host's conversations by label —
// a running container, or only a workspace volume left behind — and never
// another host's or a container this host did not create.
func TestDockerConversationsListsOnlyOurs(t *testing.T) {
	a, cfgA := newBackend(t, nil)
	other, _ := newBackend(t, nil)
	ctx := testCtx(t)
	running, volumeOnly, othersOnly := newSpec(imgTestAgent), newSpec(imgTestAgent), newSpec(imgTestAgent)

	if _, err := a.Ensure(ctx, running); err != nil {
		t.Fatal(err)
	}
	sb, err := a.Ensure(ctx, volumeOnly)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.engine.ContainerRemove(ctx, sb.ID, container.RemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Ensure(ctx, othersOnly); err != nil {
		t.Fatal(err)
	}
	foreign, err := env.engine.ContainerCreate(ctx, &container.Config{
		Image:      env.image,
		Entrypoint: []string{imgTestAgent},
		Labels:     map[string]string{docker.LabelHost: cfgA.Host, docker.LabelConversation: "conv-foreign"},
	}, &container.HostConfig{NetworkMode: "none"}, nil, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.engine.ContainerRemove(context.Background(), foreign.ID, container.RemoveOptions{Force: true})
	})

	want := []string{running.ConversationID, volumeOnly.ConversationID}
	slices.Sort(want)
	if got, err := a.Conversations(ctx); err != nil || !slices.Equal(got, want) {
		t.Fatalf("conversations %v (%v), want %v", got, err, want)
	}
	if err := a.Remove(ctx, volumeOnly.ConversationID); err != nil {
		t.Fatal(err)
	}
	if got, err := a.Conversations(ctx); err != nil || !slices.Equal(got, []string{running.ConversationID}) {
		t.Fatalf("after remove: %v (%v)", got, err)
	}
}

// K8 per sandbox: a sandbox records the cluster of the turn that created
// it on its workspace volume and its container (LabelCluster), and Listed
// gives it — from a fresh Backend too, the engine's labels being the
// record. A later Ensure granted by another cluster changes nothing; a
// container made anew over the workspace is still listed under the
// volume's cluster; one made with no cluster lists none.
func TestDockerListedNamesTheClusterCreatedUnder(t *testing.T) {
	a, cfgA := newBackend(t, nil)
	ctx := testCtx(t)
	underA, recreated, none := newSpec(imgTestAgent), newSpec(imgTestAgent), newSpec(imgTestAgent)
	underA.Cluster, recreated.Cluster = "cluster_a", "cluster_a"
	for _, sp := range []sandbox.Spec{underA, recreated, none} {
		if _, err := a.Ensure(ctx, sp); err != nil {
			t.Fatal(err)
		}
	}
	again := underA
	again.Cluster = "cluster_b"
	sb, err := a.Ensure(ctx, again)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := env.engine.ContainerInspect(ctx, sb.ID); err != nil || info.Config.Labels[docker.LabelCluster] != "cluster_a" {
		t.Fatalf("container labels %v (%v), want %s=cluster_a", info.Config, err, docker.LabelCluster)
	}
	// The container gone, a turn granted by B makes it anew over A's workspace.
	rsb, err := a.Ensure(ctx, recreated)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.engine.ContainerRemove(ctx, rsb.ID, container.RemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	recreated.Cluster = "cluster_b"
	if _, err := a.Ensure(ctx, recreated); err != nil {
		t.Fatal(err)
	}

	want := []sandbox.Listed{
		{ConversationID: underA.ConversationID, Cluster: "cluster_a"},
		{ConversationID: recreated.ConversationID, Cluster: "cluster_a"},
		{ConversationID: none.ConversationID},
	}
	slices.SortFunc(want, func(x, y sandbox.Listed) int { return strings.Compare(x.ConversationID, y.ConversationID) })
	fresh, err := docker.New(cfgA)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := fresh.Listed(ctx); err != nil || !slices.Equal(got, want) {
		t.Fatalf("listed %v (%v), want %v", got, err, want)
	}
}

// S6: a record the supervisor in the container leaves in its state
// directory (/.runnerd/state, sandbox.TeardownRecordsDir) for a teardown
// it could not prove is what CollectTeardownRecords returns, from the
// host's side of the bind mount, once: the file is removed.
func TestDockerCollectsTheSupervisorsTeardownRecords(t *testing.T) {
	b, _ := newBackend(t, nil)
	ctx := testCtx(t)
	spec := newSpec(imgTestAgent)
	sb, err := b.Ensure(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	rec := sandbox.TeardownRecord{Teardown: "fence", Generation: 7, AgentPID: 12, PIDs: []int{34}, BudgetMS: 15000, At: time.Now().UTC().Truncate(time.Second)}
	body, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	var tarball bytes.Buffer
	tw := tar.NewWriter(&tarball)
	for _, h := range []*tar.Header{
		{Name: sandbox.TeardownRecordsDir + "/", Typeflag: tar.TypeDir, Mode: 0o700},
		{Name: sandbox.TeardownRecordsDir + "/7-1.json", Typeflag: tar.TypeReg, Mode: 0o600, Size: int64(len(body))},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tw.Write(body); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := env.engine.CopyToContainer(ctx, sb.ID, "/.runnerd/state", &tarball, container.CopyToContainerOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := b.CollectTeardownRecords(ctx, spec.ConversationID)
	if err != nil || len(got) != 1 || got[0].Teardown != "fence" || !slices.Equal(got[0].PIDs, []int{34}) || !got[0].At.Equal(rec.At) {
		t.Fatalf("collected %+v (%v), want %+v", got, err, rec)
	}
	if again, err := b.CollectTeardownRecords(ctx, spec.ConversationID); err != nil || len(again) != 0 {
		t.Fatalf("collected again %+v (%v), want none", again, err)
	}
}

// Limits: a conversation's limits are applied to its container as the engine
// reports it: each where it is lower than the host's (or the host sets
// none), the host's where the conversation asks more — a sandbox never gets
// more than its host allows. A retained container keeps the limits it was
// created with (they are fixed at the conversation's creation). A
// disk_bytes limit is declined in Preflight (limits_unsupported, the
// conversation's fault), never run unbounded.
func TestDockerConversationLimits(t *testing.T) {
	b, _ := newBackend(t, func(c *docker.Config) {
		c.PidsLimit = 128
		c.MemoryBytes = 512 << 20
		c.NanoCPUs = 2_000_000_000
	})
	unlimited, _ := newBackend(t, func(c *docker.Config) {
		c.PidsLimit, c.MemoryBytes, c.NanoCPUs = -1, -1, -1
	})
	ctx := testCtx(t)
	inspect := func(b *docker.Backend, spec sandbox.Spec) *container.HostConfig {
		t.Helper()
		sb, err := b.Ensure(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		info, err := env.engine.ContainerInspect(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		return info.HostConfig
	}
	for _, tc := range []struct {
		name             string
		b                *docker.Backend
		limits           wire.Limits
		pids, mem, nanos int64
	}{
		{"under the host's", b, wire.Limits{Pids: 32, MemoryBytes: 64 << 20, CPUs: 0.5}, 32, 64 << 20, 500_000_000},
		{"over the host's", b, wire.Limits{Pids: 1000, MemoryBytes: 1 << 30, CPUs: 4}, 128, 512 << 20, 2_000_000_000},
		{"only memory", b, wire.Limits{MemoryBytes: 96 << 20}, 128, 96 << 20, 2_000_000_000},
		{"host without limits", unlimited, wire.Limits{Pids: 40, MemoryBytes: 80 << 20, CPUs: 1.25}, 40, 80 << 20, 1_250_000_000},
	} {
		spec := newSpec(imgTestAgent)
		spec.Limits = tc.limits
		hc := inspect(tc.b, spec)
		if hc.PidsLimit == nil || *hc.PidsLimit != tc.pids || hc.Memory != tc.mem || hc.MemorySwap != tc.mem || hc.NanoCPUs != tc.nanos {
			pids := int64(0)
			if hc.PidsLimit != nil {
				pids = *hc.PidsLimit
			}
			t.Errorf("%s (%+v): docker inspect shows pids %d memory %d swap %d nano cpus %d; want %d, %d, %d, %d",
				tc.name, tc.limits, pids, hc.Memory, hc.MemorySwap, hc.NanoCPUs, tc.pids, tc.mem, tc.mem, tc.nanos)
		}
		if tc.name == "under the host's" {
			// The retained container is reused as it was made.
			spec.Limits = wire.Limits{Pids: 16}
			if again := inspect(tc.b, spec); *again.PidsLimit != tc.pids || again.Memory != tc.mem {
				t.Errorf("the retained container's limits changed to pids %d memory %d", *again.PidsLimit, again.Memory)
			}
		}
	}

	spec := newSpec(imgTestAgent)
	spec.Limits = wire.Limits{DiskBytes: 1 << 30}
	var pe *sandbox.PreflightError
	if err := b.Preflight(ctx, spec); !errors.As(err, &pe) || pe.Class != sandbox.ClassLimitsUnsupported || !sandbox.ConversationFault(pe.Class) {
		t.Fatalf("Preflight with disk_bytes = %v; want %s, the conversation's fault", err, sandbox.ClassLimitsUnsupported)
	}
}
