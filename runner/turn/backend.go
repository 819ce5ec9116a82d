package turn

import (
	"fmt"

	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/docker"
	"github.com/runnerd/runnerd/sandbox/process"
)

// OpenBackend builds the sandbox backend a Sandbox config names. The daemon
// uses it too, to remove the sandboxes of conversations that became LOST.
func OpenBackend(s Sandbox) (sandbox.Backend, error) {
	switch s.Backend {
	case sandbox.BackendProcess, "":
		return process.New(process.Config{StateDir: s.StateDir, Command: []string{s.Runnerd, "supervise"}})
	case sandbox.BackendDocker:
		engine, err := docker.EngineFromEnv()
		if err != nil {
			return nil, fmt.Errorf("docker backend: %w", err)
		}
		return docker.New(docker.Config{
			Engine:      engine,
			Host:        s.HostName,
			StateDir:    s.StateDir,
			RunnerdPath: s.Runnerd,
			Network:     s.Docker.Network,
			PidsLimit:   s.Docker.PidsLimit,
			MemoryBytes: s.Docker.MemoryBytes,
			NanoCPUs:    s.Docker.NanoCPUs,
			LogMaxBytes: s.Docker.LogMaxBytes,
			LogMaxFiles: s.Docker.LogMaxFiles,
		})
	default:
		return nil, fmt.Errorf("unknown sandbox backend %q (want process or docker)", s.Backend)
	}
}
