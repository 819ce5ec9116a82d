package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// childName is the process backend's lean entry point (cmd/runnerd-child),
// looked for beside the runnerd executable.
const childName = "runnerd-child"

// childExecutable is what the daemon starts for each turn child and, as
// the payload's runnerd, for each supervisor when the backend is process:
// runnerd-child beside self when it is there and reports this build's
// version, so that a turn does not pay runnerd's package initialisation
// (Prometheus, systemd, the Docker client) at every start.
// Otherwise self, which runs the same roles, with why for the start record
// (runnerd_turn_executable). A runnerd-child of another build is never
// started: the handover between the daemon and its child is one build's.
func childExecutable(self string) (path, why string) {
	p := filepath.Join(filepath.Dir(self), childName)
	if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return self, "no executable " + childName + " beside runnerd"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, p, "version").Output()
	if err != nil {
		return self, fmt.Sprintf("%s version: %v", p, err)
	}
	if got, want := strings.TrimSpace(string(out)), childName+" "+version; got != want {
		return self, fmt.Sprintf("%s reports %q, not %q", p, got, want)
	}
	return p, ""
}
