// Command runnerd-child is the process backend's lean entry point for the
// two roles `runnerd run` starts below itself:
//
//	runnerd-child turn       one turn's child, with fd 3 (runner/turn), process backend only
//	runnerd-child supervise  a sandbox's manager (sandbox/supervisor)
//	runnerd-child version    the version, which must be runnerd's
//
// It is runnerd without the daemon and without the Docker backend: the
// same roles as `runnerd turn` and `runnerd supervise` (package
// cmd/internal/child), minus the package initialisation of Prometheus, the
// systemd bindings and the Docker client, which every turn would otherwise
// pay at its start. `runnerd run` with the process backend
// starts it when it lies beside the runnerd executable and reports the
// same version; otherwise it starts runnerd itself (docs/operations.md).
package main

import (
	"fmt"
	"os"

	"github.com/runnerd/runnerd/cmd/internal/child"
	"github.com/runnerd/runnerd/runner/turn"
)

// version is set at build time (-X main.version=…), like runnerd's.
var version = "dev"

const usage = "usage: runnerd-child turn | runnerd-child supervise [flags] | runnerd-child version"

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	switch os.Args[1] {
	case "turn":
		os.Exit(child.Turn(turn.OpenProcess))
	case "supervise":
		os.Exit(child.Supervise(os.Args[2:]))
	case "version", "--version", "-version":
		fmt.Println("runnerd-child", version)
	default:
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
}
