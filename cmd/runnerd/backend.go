package main

import (
	"fmt"
	"log/slog"

	"github.com/runnerd/runnerd/runner/turn"
	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/docker"
)

// openBackend is runnerd's turn.Opener: every sandbox backend. (The
// process backend's lean child, cmd/runnerd-child, links only
// turn.OpenProcess.)
func openBackend(s turn.Sandbox, log *slog.Logger) (sandbox.Backend, error) {
	switch s.Backend {
	case sandbox.BackendProcess, "":
		return turn.OpenProcess(s, log)
	case sandbox.BackendDocker:
		engine, err := docker.EngineFromEnv()
		if err != nil {
			return nil, fmt.Errorf("docker backend: %w", err)
		}
		return docker.New(docker.Config{
			Engine:         engine,
			Host:           s.HostName,
			StateDir:       s.StateDir,
			RunnerdPath:    s.Runnerd,
			Pull:           s.Docker.Pull,
			Network:        s.Docker.Network,
			PidsLimit:      s.Docker.PidsLimit,
			MemoryBytes:    s.Docker.MemoryBytes,
			NanoCPUs:       s.Docker.NanoCPUs,
			LogMaxBytes:    s.Docker.LogMaxBytes,
			LogMaxFiles:    s.Docker.LogMaxFiles,
			TeardownBudget: s.TeardownBudget,
			Logger:         log,
		})
	default:
		return nil, fmt.Errorf("unknown sandbox backend %q (want process or docker)", s.Backend)
	}
}
