// Package child runs the two roles a daemon starts below itself — the turn
// child (`turn`) and the sandbox supervisor (`supervise`) — for both
// executables that carry them: runnerd, which links every sandbox backend,
// and runnerd-child, the process backend's lean entry point, which links
// neither the daemon's packages (Prometheus, systemd) nor the Docker
// client's, whose package initialisation alone costs milliseconds at
// every start. With cmd/runnerd's main, this is the only
// code that installs signal handlers for those roles.
package child

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/runnerd/runnerd/runner/turn"
	"github.com/runnerd/runnerd/sandbox/supervisor"
)

// Turn is the `turn` role: one turn, handed over on fd 3, its backend
// built by open. It returns the exit code.
func Turn(open turn.Opener) int {
	absorbHangup()
	outliveLogReader()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return turn.Main(ctx, os.Stderr, open)
}

// Supervise is the `supervise` role with its arguments. It returns the
// exit code.
func Supervise(args []string) int {
	absorbHangup()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return supervisor.Main(ctx, args, os.Stderr)
}

// outliveLogReader keeps a turn child alive when the reader of its stderr
// (the daemon's, shared) is gone: a turn outlives its daemon (P5), and Go
// would end it with SIGPIPE at its next record into a pipe the dead daemon's
// reader held. With SIGPIPE handled, the write fails with EPIPE instead and
// the turn goes on. Handled, not ignored, for the same reason as SIGHUP.
func outliveLogReader() {
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
}

// absorbHangup keeps a SIGHUP or SIGUSR1 (the daemon's drain) from ending
// a turn child or a supervisor (K11): by default either would, and
// `systemctl kill -s HUP` sends it to every process of the unit. Handled,
// not ignored: an ignored signal stays ignored across exec, and the agents
// must get the default back.
func absorbHangup() {
	signal.Notify(make(chan os.Signal, 1), syscall.SIGHUP, syscall.SIGUSR1)
}
