package supervisor

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// Main is "runnerd supervise": it parses args (without the subcommand
// word), serves until ctx ends and returns the exit status. The caller
// (cmd/runnerd) owns signals: it cancels ctx on SIGTERM/SIGINT.
//
//	runnerd supervise --socket PATH --workspace DIR [--state DIR] [--id ID] [--ready-fd N] [--subreaper]
//
// Records go to stderr as JSON, and so does the agent's stderr. With
// --ready-fd the supervisor writes "ready\n" to that inherited descriptor
// once its socket listens, then closes it, so a starter can wait on a pipe
// instead of polling. --subreaper (on by default as PID 1) reaps what
// agents leave behind; see Config.Subreaper.
func Main(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("supervise", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg Config
	readyFD := fs.Int("ready-fd", -1, "descriptor to write \"ready\\n\" to once listening")
	fs.StringVar(&cfg.Socket, "socket", "", "unix socket path to serve (required)")
	fs.StringVar(&cfg.Workspace, "workspace", "", "the agent's working directory (required)")
	fs.StringVar(&cfg.StateDir, "state", "", "durable supervisor state (default WORKSPACE/.runnerd)")
	fs.StringVar(&cfg.ID, "id", "", "sandbox identity reported by status")
	fs.BoolVar(&cfg.Subreaper, "subreaper", os.Getpid() == 1, "reap processes agents leave behind (default on as PID 1)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if cfg.Socket == "" || cfg.Workspace == "" || fs.NArg() != 0 {
		fmt.Fprintln(stderr, "usage: runnerd supervise --socket PATH --workspace DIR [--state DIR] [--id ID] [--ready-fd N] [--subreaper]")
		return 2
	}
	// Descriptors this process inherited without close-on-exec (a
	// starter's leak) must not reach the agents: mark them all.
	closeInheritedOnExec()
	cfg.Logger = slog.New(slog.NewJSONHandler(stderr, nil))
	cfg.AgentStderr = stderr
	if *readyFD >= 0 {
		f := os.NewFile(uintptr(*readyFD), "ready")
		if f == nil {
			fmt.Fprintln(stderr, "supervise: --ready-fd is not a descriptor")
			return 2
		}
		cfg.Ready = func() {
			_, _ = f.WriteString("ready\n")
			f.Close()
		}
	}
	if err := Serve(ctx, cfg); err != nil && !errors.Is(err, context.Canceled) {
		recordFailed(cfg.Logger, "serve")
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// closeInheritedOnExec sets close-on-exec on every descriptor above stderr.
// Go opens its own that way already; this catches inherited ones.
func closeInheritedOnExec() {
	if unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC) == nil {
		return
	}
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
}
