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

// WaitGone waits up to timeout for pid to exit (on a pidfd, and for
// a zombie, which never becomes readable twice) and returns when it saw
// it gone.
func WaitGone(pid int, timeout time.Duration) (time.Time, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return time.Now(), nil
	}
	if err != nil {
		return time.Time{}, err
	}
	defer unix.Close(fd)
	deadline := time.Now().Add(timeout)
	for {
		if Zombie(pid) {
			return time.Now(), nil
		}
		ms := min(int(time.Until(deadline).Milliseconds()), 50)
		if ms <= 0 {
			return time.Time{}, fmt.Errorf("pid %d still running after %v", pid, timeout)
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, ms)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return time.Time{}, err
		}
		if n > 0 {
			return time.Now(), nil
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
