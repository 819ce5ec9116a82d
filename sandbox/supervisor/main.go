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
	"os/user"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Main is "runnerd supervise": it parses args (without the subcommand
// word), serves until ctx ends and returns the exit status. The caller
// (cmd/runnerd) owns signals: it cancels ctx on SIGTERM/SIGINT.
//
//	runnerd supervise --socket PATH --workspace DIR [--state DIR] [--agent-user USER[:GROUP]] [--id ID] [--ready-fd N] [--subreaper]
//
// Records go to stderr as JSON, and so does the agent's stderr. With
// --ready-fd the supervisor writes "ready\n" to that inherited descriptor
// once its socket listens, then closes it, so a starter can wait on a pipe
// instead of polling. --subreaper (on by default as PID 1) reaps what
// agents leave behind; see Config.Subreaper. --agent-user runs the agents
// as that user (a name or uid of this system's /etc/passwd, never root),
// so that they cannot write the state directory; see Config.AgentCredential.
func Main(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("supervise", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg Config
	readyFD := fs.Int("ready-fd", -1, "descriptor to write \"ready\\n\" to once listening")
	fs.StringVar(&cfg.Socket, "socket", "", "unix socket path to serve (required)")
	fs.StringVar(&cfg.Workspace, "workspace", "", "the agent's working directory (required)")
	fs.StringVar(&cfg.StateDir, "state", "", "durable supervisor state, outside the workspace (default: supervisor-state beside it)")
	agentUser := fs.String("agent-user", "", "run the agents as this user[:group] (not root); default: the supervisor's user")
	fs.StringVar(&cfg.ID, "id", "", "sandbox identity reported by status")
	fs.BoolVar(&cfg.Subreaper, "subreaper", os.Getpid() == 1, "reap processes agents leave behind (default on as PID 1)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if cfg.Socket == "" || cfg.Workspace == "" || fs.NArg() != 0 {
		fmt.Fprintln(stderr, "usage: runnerd supervise --socket PATH --workspace DIR [--state DIR] [--agent-user USER[:GROUP]] [--id ID] [--ready-fd N] [--subreaper]")
		return 2
	}
	if *agentUser != "" {
		cred, err := lookupCredential(*agentUser)
		if err != nil {
			fmt.Fprintln(stderr, "supervise: --agent-user:", err)
			return 2
		}
		cfg.AgentCredential = cred
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

// lookupCredential resolves "user[:group]" the way the container engine
// resolves a USER: names (or numbers) from /etc/passwd and /etc/group, the
// user's primary group when no group is given, and the supplementary
// groups /etc/group lists for a named user. A bare number not in
// /etc/passwd is that uid with gid 0, unless a group is given. Root is
// refused: an agent running as root could write the state directory.
func lookupCredential(spec string) (*syscall.Credential, error) {
	name, group, hasGroup := strings.Cut(spec, ":")
	var cred syscall.Credential
	u, err := user.Lookup(name)
	if err != nil {
		u, err = user.LookupId(name)
	}
	switch {
	case err == nil:
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("user %q has no numeric uid and gid", name)
		}
		cred.Uid, cred.Gid = uint32(uid), uint32(gid)
		if ids, err := u.GroupIds(); err == nil {
			for _, id := range ids {
				if g, err := strconv.ParseUint(id, 10, 32); err == nil && uint32(g) != cred.Gid {
					cred.Groups = append(cred.Groups, uint32(g))
				}
			}
		}
	default:
		uid, perr := strconv.ParseUint(name, 10, 32)
		if perr != nil {
			return nil, fmt.Errorf("user %q is not in /etc/passwd", name)
		}
		cred.Uid = uint32(uid)
	}
	if hasGroup {
		gid, perr := strconv.ParseUint(group, 10, 32)
		if perr != nil {
			g, err := user.LookupGroup(group)
			if err != nil {
				return nil, fmt.Errorf("group %q is not in /etc/group", group)
			}
			if gid, perr = strconv.ParseUint(g.Gid, 10, 32); perr != nil {
				return nil, fmt.Errorf("group %q has no numeric gid", group)
			}
		}
		cred.Gid, cred.Groups = uint32(gid), nil
	}
	if cred.Uid == 0 {
		return nil, fmt.Errorf("%q is root: an agent running as root could write the supervisor's state", spec)
	}
	return &cred, nil
}
