package fleet

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Proc is one live process found in /proc.
type Proc struct {
	Pid  int
	Argv []string
	Cwd  string
}

func (p Proc) String() string { return fmt.Sprintf("pid %d %q", p.Pid, p.Argv) }

// Match selects processes of a fleet.
type Match func(Proc) bool

// Executable matches the processes running one of paths: with a runnerd
// (and runnerd-child) of its own, a fleet's daemon, turn children and
// supervisors. An empty path matches nothing.
func Executable(paths ...string) Match {
	return func(p Proc) bool {
		for _, path := range paths {
			if path != "" && p.Argv[0] == path {
				return true
			}
		}
		return false
	}
}

// Under matches the processes that name dir (or a path below it) as an
// argument or work below it: a daemon of that state directory (--state-dir),
// its supervisors (--socket, --workspace) and its agents (their workspace).
func Under(dir string) Match {
	return func(p Proc) bool {
		if strings.HasPrefix(p.Cwd, dir+"/") {
			return true
		}
		for _, a := range p.Argv[1:] {
			if a == dir || strings.HasPrefix(a, dir+"/") {
				return true
			}
		}
		return false
	}
}

// Procs lists the live processes (zombies left out) that any of match
// selects.
func Procs(match ...Match) ([]Proc, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []Proc
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil || Zombie(pid) {
			continue
		}
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || len(raw) == 0 {
			continue // gone, or a kernel thread
		}
		p := Proc{Pid: pid, Argv: strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")}
		p.Cwd, _ = os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
		for _, m := range match {
			if m(p) {
				out = append(out, p)
				break
			}
		}
	}
	return out, nil
}

// Zombie reports whether pid has exited (or is not there).
func Zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z' || s[i+2] == 'X'
}

// Alive reports whether pid runs (and is not a zombie).
func Alive(pid int) bool {
	return unix.Kill(pid, 0) == nil && !Zombie(pid)
}

// Exit brackets a process's end as a watcher saw it: the process was
// still there at LastAlive and gone at Seen, so it ended in (LastAlive,
// Seen]. A watcher scheduled late (a loaded machine) widens the bracket
// and never moves it: a test of "gone by T" fails only when LastAlive is
// after T, one of "not gone before T" only when Seen is before T.
type Exit struct {
	LastAlive time.Time // zero when the process was gone at the first look
	Seen      time.Time
}

// exitSample is how often WaitGone looks at a process that has not ended:
// it bounds how tight the bracket can be on an idle machine.
const exitSample = 5 * time.Millisecond

// WaitGone waits up to timeout for pid to exit (on a pidfd, and for a
// zombie, which the pidfd may not report while its parent lives) and
// returns the bracket of its end.
func WaitGone(pid int, timeout time.Duration) (Exit, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return Exit{Seen: time.Now()}, nil
	}
	if err != nil {
		return Exit{}, err
	}
	defer unix.Close(fd)
	var e Exit
	deadline := time.Now().Add(timeout)
	for {
		// Read before the looks: a process found there afterwards was
		// there at this instant too.
		before := time.Now()
		if Zombie(pid) {
			e.Seen = time.Now()
			return e, nil
		}
		if before.After(deadline) {
			return e, fmt.Errorf("pid %d still running after %v", pid, timeout)
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(exitSample.Milliseconds()))
		if err != nil && !errors.Is(err, unix.EINTR) {
			return e, err
		}
		if n > 0 {
			e.Seen = time.Now()
			return e, nil
		}
		if err == nil {
			e.LastAlive = before
		}
	}
}

// StopProcs ends every process that match selects — supervisors outlive
// their daemon by design — with SIGTERM, then SIGKILL after grace, and
// waits for each. It returns how many it found.
func StopProcs(grace time.Duration, match ...Match) (int, error) {
	found := 0
	for round := range 3 {
		ps, err := Procs(match...)
		if err != nil {
			return found, err
		}
		if len(ps) == 0 {
			return found, nil
		}
		found += len(ps)
		sig := unix.SIGTERM
		if round > 0 {
			sig = unix.SIGKILL
		}
		for _, p := range ps {
			_ = unix.Kill(p.Pid, sig)
		}
		for _, p := range ps {
			if _, err := WaitGone(p.Pid, grace); err != nil && sig == unix.SIGKILL {
				return found, err
			}
		}
	}
	return found, errors.New("processes keep appearing under the state directory")
}

// Freeze stops the process group pgid with SIGSTOP and returns once every
// thread of its leader is stopped. kill(2) returning is not that: the
// kernel wakes one thread to take the stop, and the others of a
// multi-threaded process (every Go program) run on until it has, long
// enough on a loaded machine to answer a connection. There is no event
// for a stop the caller is not the parent of, so this looks at /proc
// (every millisecond, up to timeout).
func Freeze(pgid int, timeout time.Duration) error {
	if err := unix.Kill(-pgid, unix.SIGSTOP); err != nil {
		return fmt.Errorf("SIGSTOP to process group %d: %w", pgid, err)
	}
	return awaitStopped(pgid, timeout)
}

// FreezeProcess is Freeze for the one process pid.
func FreezeProcess(pid int, timeout time.Duration) error {
	if err := unix.Kill(pid, unix.SIGSTOP); err != nil {
		return fmt.Errorf("SIGSTOP to pid %d: %w", pid, err)
	}
	return awaitStopped(pid, timeout)
}

func awaitStopped(pid int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		stopped, err := threadsStopped(pid)
		if err != nil || stopped {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pid %d not stopped %v after SIGSTOP", pid, timeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// threadsStopped reports whether every thread of pid is in the stopped
// state (T; t for one stopped by a tracer).
func threadsStopped(pid int) (bool, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false, fmt.Errorf("threads of pid %d: %w", pid, err)
	}
	for _, ent := range ents {
		b, err := os.ReadFile(dir + "/" + ent.Name() + "/stat")
		if err != nil {
			continue // a thread that has just exited
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 || i+2 >= len(s) || (s[i+2] != 'T' && s[i+2] != 't') {
			return false, nil
		}
	}
	return true, nil
}
