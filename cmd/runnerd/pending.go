package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/runnerd/runnerd/runner"
	"github.com/runnerd/runnerd/sandbox"
)

// runTurn is `runnerd turn`. Until runner/turn.Main lands it declines
// nothing and accepts nothing: it exits, which the daemon sees as a
// decline (the descriptor closed without ACCEPT) and releases the claim.
func runTurn(ctx context.Context, stderr io.Writer) int {
	_ = ctx
	fmt.Fprintln(stderr, "runnerd turn: not built into this binary yet")
	return 70
}

// processBackend is the process backend's handle for the daemon. Until
// sandbox/process lands there is none, and LOST conversations' process
// sandboxes are left in place (a record says so).
func processBackend(cfg runner.Config, log *slog.Logger) (sandbox.Backend, error) {
	_, _ = cfg, log
	return nil, nil
}
