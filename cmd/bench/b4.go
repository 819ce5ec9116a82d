package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/docker"
	"github.com/runnerd/runnerd/wire"
)

// b4 is claim → ACCEPT as a user meets it: the real
// binaries, `controlplane serve` on SQLite and `runnerd run --sandbox
// <backend> --capacity 2`, one conversation whose messages are sent over
// the user API one after another, each once the control plane shows the
// one before ended (as `controlplane submit` waits). The figure is each
// runnerd_turn_accepted record's since_claim_ms. It used to run on B3's
// daemon (capacity 16, the control plane inside the bench, turns enqueued
// in the store round 32 conversations), which hid a part of what a user
// waits for; docs/performance.md has the comparison.
//
// The Docker row runs when the engine answers, on warm turns: the
// conversation's first turn (which creates its container) is not counted.
func (b *bench) b4(ctx context.Context, backend string) error {
	single := b.size(100, 5)
	bins, err := binaries(b.o.bin)
	if err != nil {
		return err
	}
	cpBin := filepath.Join(filepath.Dir(bins.Runnerd), "controlplane")
	dir, err := os.MkdirTemp("", "runnerd-bench-b4-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	image, agent := "process", []string{bins.DemoAgent}
	if backend == sandbox.BackendDocker {
		engine, err := docker.EngineFromEnv()
		if err != nil {
			return fmt.Errorf("docker: %w", err)
		}
		image, agent = "runnerd-bench/agent:dev", []string{"/demoagent"}
		if err := docker.BuildScratchImage(ctx, engine, docker.ScratchImage{
			Tag: image, Files: []docker.ImageFile{{Path: "/demoagent", Source: bins.DemoAgent, Exec: true}}, User: "65534:65534",
		}); err != nil {
			return err
		}
	}

	cp, err := fleet.StartControlPlane(ctx, fleet.ControlPlaneConfig{Bin: cpBin, DataDir: filepath.Join(dir, "cp")})
	if err != nil {
		return err
	}
	defer func() { _ = cp.Stop(syscall.SIGTERM, 10*time.Second) }()
	defer cp.User.Close()
	tokenFile, err := cp.AddHost(ctx, "bench-b4")
	if err != nil {
		return err
	}
	stateDir := filepath.Join(dir, "state")
	recs := newRecords()
	d, err := fleet.StartDaemon(ctx, fleet.DaemonConfig{
		Bin: bins.Runnerd, ControlPlaneURL: cp.URL, HostTokenFile: tokenFile, HostName: "bench-b4",
		StateDir: stateDir, Capacity: 2, Sandbox: backend, Log: recs,
	})
	if err != nil {
		return err
	}
	defer func() {
		_ = d.Stop(syscall.SIGTERM, 30*time.Second)
		_, _ = fleet.StopProcs(5*time.Second, fleet.Under(stateDir))
		if backend == sandbox.BackendDocker {
			b.removeContainers(ctx, bins, stateDir)
		}
	}()

	conv, err := cp.User.Create(ctx, wire.CreateConversationRequest{Title: "bench B4", Image: image, AgentCommand: agent, Sandbox: backend})
	if err != nil {
		return err
	}
	turn := func(i int) error {
		j, err := cp.User.Send(ctx, conv.ID, fmt.Sprint("turn ", i))
		if err != nil {
			return err
		}
		ended, err := cp.User.WaitEnded(ctx, j.ID, 5*time.Millisecond)
		if err != nil {
			return fmt.Errorf("%w\n%s", err, tail(d.Output()))
		}
		if ended.State != wire.JobSucceeded {
			return fmt.Errorf("turn %d ended %s\n%s", i, ended.State, tail(d.Output()))
		}
		return nil
	}
	if err := turn(0); err != nil { // the conversation's supervisor (and container) start
		return fmt.Errorf("first turn: %w", err)
	}
	_, from := recs.mark()
	for i := 1; i <= single; i++ {
		if err := turn(i); err != nil {
			return err
		}
	}
	ms := recs.acceptsSince(from)
	if len(ms) != single {
		return fmt.Errorf("%d claim → ACCEPT times recorded for %d turns", len(ms), single)
	}
	slices.Sort(ms)
	what := "claim → ACCEPT, idle host, " + backend + " backend"
	detail := fmt.Sprintf("%d turns of one conversation one after another, controlplane serve and runnerd run --capacity 2", single)
	if backend == sandbox.BackendDocker {
		detail = fmt.Sprintf("%d warm turns of one conversation one after another, controlplane serve and runnerd run --capacity 2", single)
	}
	b.rep.add(row{ID: "B4", Store: sqliteFull, What: what + ", p50", Value: quantile(ms, 0.5), Unit: "ms", Detail: detail})
	b.rep.add(row{ID: "B4", Store: sqliteFull, What: what + ", p99", Value: quantile(ms, 0.99), Unit: "ms",
		Detail: fmt.Sprintf("max %.2f ms", ms[len(ms)-1])})
	return nil
}

// removeContainers removes what the Docker row's daemon left: its
// conversation's retained container and volume.
func (b *bench) removeContainers(ctx context.Context, bins bins, stateDir string) {
	engine, err := docker.EngineFromEnv()
	if err != nil {
		return
	}
	be, err := docker.New(docker.Config{Engine: engine, Host: "bench-b4", StateDir: stateDir, RunnerdPath: bins.Runnerd})
	if err != nil {
		return
	}
	if _, err := be.Sweep(ctx, func(string) bool { return true }); err != nil {
		b.logf("B4 docker: remove the containers: %v", err)
	}
}

// dockerAnswers reports whether a Docker engine answers, for B4's Docker row.
func dockerAnswers(ctx context.Context) bool {
	engine, err := docker.EngineFromEnv()
	if err != nil {
		return false
	}
	defer engine.Close()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = engine.Ping(pctx)
	return err == nil
}
