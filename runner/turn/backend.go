package turn

import (
	"fmt"
	"log/slog"

	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/process"
)

// Opener builds the sandbox backend a Sandbox config names. Each
// executable that runs turns passes Main the backends it links: runnerd
// all of them (cmd/runnerd), the process backend's lean child only
// OpenProcess (cmd/runnerd-child), so that a process turn does not pay for
// the Docker client's packages at every start. The daemon builds its own
// handle on the sandboxes with the same function. log (nil: discarded)
// receives the backend's records.
type Opener func(Sandbox, *slog.Logger) (sandbox.Backend, error)

// OpenProcess is the Opener of the process backend alone.
func OpenProcess(s Sandbox, log *slog.Logger) (sandbox.Backend, error) {
	if s.Backend != sandbox.BackendProcess && s.Backend != "" {
		return nil, fmt.Errorf("sandbox backend %q is not in this executable (the process backend's child runs process turns only)", s.Backend)
	}
	return process.New(process.Config{StateDir: s.StateDir, Command: []string{s.Runnerd, "supervise"},
		TeardownBudget: s.TeardownBudget, Logger: log})
}
