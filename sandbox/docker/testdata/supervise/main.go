// Command supervise stands in for `runnerd supervise` in the Docker
// backend's tests until cmd/runnerd exists: it takes the same arguments the
// backend gives the container's entrypoint and runs the real supervisor.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/runnerd/runnerd/sandbox/supervisor"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] != "supervise" {
		fmt.Fprintln(os.Stderr, "usage: supervise supervise --socket S --workspace W --id I")
		os.Exit(2)
	}
	fs := flag.NewFlagSet("supervise", flag.ExitOnError)
	socket := fs.String("socket", "", "socket path")
	workspace := fs.String("workspace", "", "workspace directory")
	id := fs.String("id", "", "sandbox identity")
	_ = fs.Parse(os.Args[2:])
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err := supervisor.Serve(ctx, supervisor.Config{
		Socket:    *socket,
		Workspace: *workspace,
		ID:        *id,
		Logger:    slog.New(slog.NewTextHandler(os.Stderr, nil)),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
