package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// pidFile is where `runnerd run` keeps its pid, in its state directory, for
// `runnerd drain` to find it.
const pidFile = "runnerd.pid"

// Why a drain is its own command and signal: SIGTERM (systemctl stop and
// restart, an upgrade) hands the running turns over to the next start and
// exits in seconds (P5); taking a host out of service is the one time the
// turns should instead finish here first. A signal reaches the daemon
// whatever state it is in (no listener to reach, nothing to authenticate
// beyond the right to signal it), and SIGUSR1 is one nothing else sends.
// The command signals the daemon alone — never its unit's other processes,
// as `systemctl kill` without --kill-whom=main would — through a pidfd, so
// a recycled pid cannot be signalled, and waits for it to exit.

// writePidFile records the daemon's pid in its state directory (0600).
func writePidFile(stateDir string) (remove func(), err error) {
	path := filepath.Join(stateDir, pidFile)
	pid := strconv.Itoa(os.Getpid())
	if err := os.WriteFile(path, []byte(pid+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("--state-dir: %w", err)
	}
	return func() {
		if b, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(b)) == pid {
			_ = os.Remove(path)
		}
	}, nil
}

// runDrain is `runnerd drain`: it asks the daemon of a state directory to
// drain (SIGUSR1) and waits until it has exited. Run again while a drain
// waits, it ends the drain at once: the daemon stops the turns still
// running and reports them. Exit 0 once the daemon is gone, 1 when there is
// no daemon to drain, 2 for bad usage.
func runDrain(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("runnerd drain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	def := getenv(envPrefix + "_STATE_DIR")
	if def == "" {
		def = "/var/lib/runnerd"
	}
	stateDir := fs.String("state-dir", def, "the daemon's state directory (env RUNNERD_STATE_DIR)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "runnerd drain: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	pid, pidfd, err := openDaemon(*stateDir)
	if err != nil {
		fmt.Fprintln(stderr, "runnerd drain: "+err.Error())
		return 1
	}
	defer unix.Close(pidfd)
	if err := unix.PidfdSendSignal(pidfd, unix.SIGUSR1, nil, 0); err != nil {
		fmt.Fprintf(stderr, "runnerd drain: signal runnerd (pid %d): %v\n", pid, err)
		return 1
	}
	fmt.Fprintf(stdout, "runnerd (pid %d) is draining: no new turns; the running ones finish (--drain-timeout); run runnerd drain again to stop them now\n", pid)
	for {
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, -1); err != nil && !errors.Is(err, unix.EINTR) {
			fmt.Fprintf(stderr, "runnerd drain: wait for pid %d: %v\n", pid, err)
			return 1
		}
		if fds[0].Revents != 0 {
			break
		}
	}
	fmt.Fprintf(stdout, "runnerd (pid %d) drained and exited\n", pid)
	return 0
}

// openDaemon finds the daemon of stateDir by its pid file and opens a pidfd
// on it, once /proc says the pid is a `runnerd run` (a stale file's pid may
// belong to anything by now).
func openDaemon(stateDir string) (pid, pidfd int, err error) {
	b, err := os.ReadFile(filepath.Join(stateDir, pidFile))
	if errors.Is(err, os.ErrNotExist) {
		return 0, -1, fmt.Errorf("no runnerd runs on %s (no %s)", stateDir, pidFile)
	}
	if err != nil {
		return 0, -1, err
	}
	pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, -1, fmt.Errorf("%s: not a pid", filepath.Join(stateDir, pidFile))
	}
	pidfd, err = unix.PidfdOpen(pid, 0)
	if err != nil {
		return 0, -1, fmt.Errorf("no runnerd runs on %s (pid %d: %v)", stateDir, pid, err)
	}
	// Checked after the pidfd is open: from now on the pid cannot be reused.
	argv, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	args := bytes.Split(argv, []byte{0})
	if err != nil || len(args) < 2 || filepath.Base(string(args[0])) != "runnerd" || string(args[1]) != "run" {
		unix.Close(pidfd)
		return 0, -1, fmt.Errorf("no runnerd runs on %s (pid %d is not runnerd run)", stateDir, pid)
	}
	return pid, pidfd, nil
}
