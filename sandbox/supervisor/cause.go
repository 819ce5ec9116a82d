package supervisor

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/wire"
)

// The cause of an agent's abnormal end (S5) is read from what the kernel
// keeps about the sandbox, not guessed from the exit status alone: a
// memory cgroup's oom_kill count and a pids cgroup's "max" count, taken
// before the agent starts and again after it ended, and a probe write on
// the filesystems the agent writes (its workspace and /tmp). The counters
// are those of the supervisor's own cgroup — the container's under Docker,
// the transient scope's under systemd — read from the cgroup v2 unified
// hierarchy or the v1 memory and pids hierarchies, whichever is mounted.

// cgroupRoot is where the cgroup hierarchies are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// counter is one cgroup event counter: the file it is read from and the
// key of its line.
type counter struct {
	file, key string
}

// counters is a snapshot of the sandbox's event counters; a counter that
// cannot be read is absent.
type counters map[counter]int64

// Counters of an OOM kill and of a fork refused at the pids limit, on
// either hierarchy (v1: memory.oom_control's oom_kill, kernel 4.13 on).
var (
	oomCounters  = []counter{{"memory.events", "oom_kill"}, {"memory/memory.oom_control", "oom_kill"}}
	pidsCounters = []counter{{"pids.events", "max"}, {"pids/pids.events", "max"}}
)

// readCounters takes the snapshot. Inside a container the hierarchy is
// mounted at the container's own cgroup while /proc/self/cgroup names its
// path on the host, so a file is looked for under that path first and at
// the mount's root after.
func readCounters() counters {
	paths := selfCgroups()
	out := counters{}
	for _, c := range append(append([]counter(nil), oomCounters...), pidsCounters...) {
		controller, name, nested := strings.Cut(c.file, "/")
		if !nested {
			controller, name = "", c.file
		}
		for _, dir := range []string{filepath.Join(cgroupRoot, controller, paths[controller]), filepath.Join(cgroupRoot, controller)} {
			if n, ok := readKey(filepath.Join(dir, name), c.key); ok {
				out[c] = n
				break
			}
		}
	}
	return out
}

// selfCgroups maps each v1 controller ("memory", "pids") and the unified
// hierarchy ("") to this process's cgroup path.
func selfCgroups() map[string]string {
	b, err := os.ReadFile("/proc/self/cgroup")
	out := map[string]string{}
	if err != nil {
		return out
	}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, ctl := range strings.Split(parts[1], ",") {
			out[ctl] = parts[2]
		}
	}
	return out
}

// readKey reads "key N" from a flat-keyed cgroup file.
func readKey(path, key string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// moved returns the first of cs whose count grew from before to after.
func moved(before, after counters, cs []counter) (counter, int64, int64, bool) {
	for _, c := range cs {
		a, okA := after[c]
		b, okB := before[c]
		if okA && okB && a > b {
			return c, b, a, true
		}
	}
	return counter{}, 0, 0, false
}

// hierarchy names where a counter file lives, for the evidence.
func hierarchy(c counter) string {
	if strings.Contains(c.file, "/") {
		return "cgroup v1 " + c.file
	}
	return "cgroup v2 " + c.file
}

// diskFull probes dirs for a full filesystem: it writes and syncs a small
// file in each, and reports the first that answers ENOSPC with the free
// space measured there.
func diskFull(dirs []string) (string, bool) {
	for _, dir := range dirs {
		if dir == "" {
			continue
		}
		f, err := os.CreateTemp(dir, ".runnerd-space-probe-*")
		if err == nil {
			_, err = f.Write(make([]byte, 4096))
			if err == nil {
				err = f.Sync()
			}
			f.Close()
			os.Remove(f.Name())
		}
		if !errors.Is(err, unix.ENOSPC) {
			continue
		}
		var st unix.Statfs_t
		free := "unmeasured"
		if unix.Statfs(dir, &st) == nil {
			free = fmt.Sprintf("%d of %d bytes free", st.Bavail*uint64(st.Bsize), st.Blocks*uint64(st.Bsize))
		}
		return fmt.Sprintf("ENOSPC writing a probe in %s; %s", dir, free), true
	}
	return "", false
}

// causeOf names why an agent that was not stopped by the supervisor ended
// as res says, from the counters before it started and now and the
// filesystems it writes. A clean exit has no cause. The sandbox's limits
// come first: an agent the OOM killer ended, or one that could not fork or
// write any more, usually exits or dies for that very reason.
func causeOf(res sandbox.Result, before, after counters, dirs []string) (wire.Cause, string) {
	if res.ExitCode == 0 && res.Signal == "" {
		return "", ""
	}
	end := fmt.Sprintf("the agent exited %d", res.ExitCode)
	if res.Signal != "" {
		end = "the agent was ended by " + res.Signal
	}
	if c, b, a, ok := moved(before, after, oomCounters); ok {
		return wire.CauseOOMKilled, fmt.Sprintf("%s oom_kill %d→%d during the turn; %s", hierarchy(c), b, a, end)
	}
	if c, b, a, ok := moved(before, after, pidsCounters); ok {
		return wire.CausePidsExhausted, fmt.Sprintf("%s max %d→%d (forks refused at the pids limit) during the turn; %s", hierarchy(c), b, a, end)
	}
	if ev, ok := diskFull(dirs); ok {
		return wire.CauseDiskFull, ev + "; " + end
	}
	if res.Signal != "" {
		return wire.CauseAgentSignal, end
	}
	return wire.CauseAgentExit, end
}
