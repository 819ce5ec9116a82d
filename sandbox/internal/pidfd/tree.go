package pidfd

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Held is a set of processes, each held by a pidfd: whatever happens to
// their pids, a pidfd refers to the process it was opened on and no other.
type Held struct {
	pids []int
	fds  []int
}

// HoldTree opens a pidfd on root and on every process descending from it
// now (by the parent pids of /proc), checking each one's start time after
// the open so a pid reused between reading /proc and the open is never
// held. A process that double-forked out of the tree before this call is
// not in it. The caller must Close or Wait the set.
func HoldTree(root int) (*Held, error) {
	type proc struct {
		ppid  int
		start uint64
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("read /proc: %w", err)
	}
	procs := map[int]proc{}
	children := map[int][]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, start, ok := stat(pid)
		if !ok {
			continue
		}
		procs[pid] = proc{ppid, start}
		children[ppid] = append(children[ppid], pid)
	}
	h := &Held{}
	queue := []int{root}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		p, ok := procs[pid]
		if !ok {
			continue // gone already
		}
		queue = append(queue, children[pid]...)
		fd, err := unix.PidfdOpen(pid, 0)
		if errors.Is(err, unix.ESRCH) {
			continue
		}
		if err != nil {
			h.Close()
			return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
		}
		if _, start, ok := stat(pid); !ok || start != p.start {
			unix.Close(fd) // exited since /proc was read: not ours to hold
			continue
		}
		h.pids, h.fds = append(h.pids, pid), append(h.fds, fd)
	}
	return h, nil
}

// PIDs are the held processes' pids, root first.
func (h *Held) PIDs() []int { return append([]int(nil), h.pids...) }

// Wait waits until every held process has exited (a zombie counts as
// exited) or deadline passes, closes the set, and returns the pids of the
// ones still running then.
func (h *Held) Wait(deadline time.Time) (running []int) {
	defer h.Close()
	for i, fd := range h.fds {
		if !exitedBy(fd, deadline) {
			running = append(running, h.pids[i])
		}
	}
	return running
}

// Close releases the pidfds.
func (h *Held) Close() {
	for _, fd := range h.fds {
		unix.Close(fd)
	}
	h.pids, h.fds = nil, nil
}

func exitedBy(fd int, deadline time.Time) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		ms := max(int(time.Until(deadline).Milliseconds()), 0) // 0: one look, however late
		n, err := unix.Poll(fds, ms)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err == nil && n > 0
	}
}

// stat reads the parent pid and start time (clock ticks since boot) of
// pid from /proc/<pid>/stat.
func stat(pid int) (ppid int, start uint64, ok bool) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// The command name, in parentheses, may hold anything: fields follow
	// its last ')'. After it: state (3), ppid (4), ..., starttime (22).
	i := strings.LastIndexByte(string(raw), ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 20 {
		return 0, 0, false
	}
	ppid, err1 := strconv.Atoi(f[1])
	start, err2 := strconv.ParseUint(f[19], 10, 64)
	return ppid, start, err1 == nil && err2 == nil
}
