// Command supervise stands in for `runnerd supervise` in the Docker
// backend's tests until cmd/runnerd exists: it is the same entry point,
// supervisor.Main, behind the same first argument.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/runnerd/runnerd/sandbox/supervisor"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] != "supervise" {
		fmt.Fprintln(os.Stderr, "usage: supervise supervise --socket S --workspace W [--id I]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := supervisor.Main(ctx, os.Args[2:], os.Stderr)
	stop()
	os.Exit(code)
}
