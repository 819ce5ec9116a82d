package held

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Roles of the processes of a host, by what they run.
const (
	RoleDaemon     = "daemon"     // runnerd run
	RoleTurn       = "turn"       // runnerd turn, one per held turn
	RoleSupervisor = "supervisor" // runnerd supervise, one per conversation (process backend)
	RoleAgent      = "agent"      // the demo agent, one per held turn
	RoleOther      = "other"      // anything else in the daemon's tree
)

// Usage is what a set of processes costs, read from /proc.
type Usage struct {
	Processes int `json:"processes"`
	Threads   int `json:"threads"`   // /proc/PID/status Threads, summed
	RSSKB     int `json:"rss_kb"`    // smaps_rollup Rss, summed: counts shared pages once per process
	PSSKB     int `json:"pss_kb"`    // smaps_rollup Pss, summed: the host's real share
	FDs       int `json:"fds"`       // open descriptors, summed
	TCP       int `json:"tcp"`       // of which TCP sockets (pooled connections to the control plane)
	CPUTicks  int `json:"cpu_ticks"` // utime+stime in clock ticks (USER_HZ), summed; a window's delta in Result
}

func (u *Usage) add(o Usage) {
	u.Processes += o.Processes
	u.Threads += o.Threads
	u.RSSKB += o.RSSKB
	u.PSSKB += o.PSSKB
	u.FDs += o.FDs
	u.TCP += o.TCP
	u.CPUTicks += o.CPUTicks
}

// proc is one process as read from /proc.
type proc struct {
	pid, ppid int
	role      string
	use       Usage
}

// userHZ is the unit of utime and stime in /proc/PID/stat; 100 on every
// Linux this runs on (sysconf(_SC_CLK_TCK) needs cgo).
const userHZ = 100

// readProc reads pid's parent, CPU ticks, threads, memory and descriptors.
// A process that is gone or a zombie gives ok false.
func readProc(pid int) (p proc, ok bool) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return p, false
	}
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return p, false
	}
	f := strings.Fields(string(stat[i+1:]))
	// Fields after the command: state(0) ppid(1) … utime(11) stime(12) … num_threads(17).
	if len(f) < 18 || f[0] == "Z" || f[0] == "X" {
		return p, false
	}
	p.pid = pid
	p.ppid, _ = strconv.Atoi(f[1])
	ut, _ := strconv.Atoi(f[11])
	st, _ := strconv.Atoi(f[12])
	p.use.CPUTicks = ut + st
	p.use.Threads, _ = strconv.Atoi(f[17])
	p.use.Processes = 1
	p.use.RSSKB, p.use.PSSKB = smapsRollup(pid)
	p.use.FDs, p.use.TCP = countFDs(pid)
	return p, true
}

// countFDs counts pid's descriptors and, among them, its TCP sockets.
func countFDs(pid int) (fds, tcp int) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0
	}
	var inodes map[string]bool
	for _, e := range ents {
		l, err := os.Readlink(dir + "/" + e.Name())
		if err != nil || !strings.HasPrefix(l, "socket:[") {
			continue
		}
		if inodes == nil {
			inodes = tcpInodes(pid)
		}
		if inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] {
			tcp++
		}
	}
	return len(ents), tcp
}

// tcpInodes is the set of socket inodes of TCP connections in pid's
// network namespace.
func tcpInodes(pid int) map[string]bool {
	out := map[string]bool{}
	for _, f := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, f))
		if err != nil {
			continue
		}
		for i, line := range strings.Split(string(b), "\n") {
			if fields := strings.Fields(line); i > 0 && len(fields) > 9 {
				out[fields[9]] = true
			}
		}
	}
	return out
}

// smapsRollup reads Rss and Pss (KB) of /proc/PID/smaps_rollup.
func smapsRollup(pid int) (rss, pss int) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		fields := strings.Fields(v)
		if len(fields) == 0 {
			continue
		}
		n, _ := strconv.Atoi(fields[0])
		switch k {
		case "Rss":
			rss = n
		case "Pss":
			pss = n
		}
	}
	return rss, pss
}

// roleOf names what argv runs, given the runnerd and agent executables.
// The process backend's turn children and supervisors run runnerd-child
// when it lies beside runnerd (cmd/runnerd-child), with the same roles.
func roleOf(argv []string, runnerd, agent string) string {
	if len(argv) == 0 {
		return RoleOther
	}
	if argv[0] == agent {
		return RoleAgent
	}
	child := filepath.Join(filepath.Dir(runnerd), "runnerd-child")
	if (argv[0] == runnerd || argv[0] == child) && len(argv) > 1 {
		switch argv[1] {
		case "run":
			return RoleDaemon
		case "turn":
			return RoleTurn
		case "supervise":
			return RoleSupervisor
		}
	}
	return RoleOther
}

func cmdline(pid int) []string {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(raw) == 0 {
		return nil
	}
	return strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
}

// snapshot is the host of one daemon at one instant: the daemon, every
// descendant of it, and every process that works under its state directory
// (the process backend's supervisors run in their own sessions, re-parented
// away from the turn child that started them, and their agents with them).
type snapshot struct {
	procs map[int]proc
}

func takeSnapshot(daemonPid int, stateDir, runnerd, agent string) (snapshot, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return snapshot{}, err
	}
	all := map[int]proc{}
	children := map[int][]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		p, ok := readProc(pid)
		if !ok {
			continue
		}
		all[pid] = p
		children[p.ppid] = append(children[p.ppid], pid)
	}
	in := map[int]bool{}
	var walk func(int)
	walk = func(pid int) {
		if in[pid] {
			return
		}
		if _, ok := all[pid]; !ok {
			return
		}
		in[pid] = true
		for _, c := range children[pid] {
			walk(c)
		}
	}
	walk(daemonPid)
	for pid := range all {
		if in[pid] {
			continue
		}
		if underDir(pid, stateDir) {
			walk(pid)
		}
	}
	s := snapshot{procs: map[int]proc{}}
	for pid := range in {
		p := all[pid]
		p.role = roleOf(cmdline(pid), runnerd, agent)
		s.procs[pid] = p
	}
	return s, nil
}

// underDir: pid names dir (or below) as an argument or works below it.
func underDir(pid int, dir string) bool {
	if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid)); err == nil && strings.HasPrefix(cwd, dir+"/") {
		return true
	}
	argv := cmdline(pid)
	for i, a := range argv {
		if i > 0 && (a == dir || strings.HasPrefix(a, dir+"/")) {
			return true
		}
	}
	return false
}

// byRole sums the snapshot's processes by role.
func (s snapshot) byRole() map[string]Usage {
	out := map[string]Usage{}
	for _, p := range s.procs {
		u := out[p.role]
		u.add(p.use)
		out[p.role] = u
	}
	return out
}

// total sums every process of the snapshot.
func (s snapshot) total() Usage {
	var u Usage
	for _, p := range s.procs {
		u.add(p.use)
	}
	return u
}

// cpuSince replaces each role's CPU ticks with those spent since before,
// counting only processes present in both snapshots.
func (s snapshot) cpuSince(before snapshot) map[string]int {
	out := map[string]int{}
	for pid, p := range s.procs {
		if b, ok := before.procs[pid]; ok {
			out[p.role] += p.use.CPUTicks - b.use.CPUTicks
		}
	}
	return out
}

// loadAvg reads /proc/loadavg's three figures.
func loadAvg() [3]float64 {
	var l [3]float64
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return l
	}
	f := strings.Fields(string(b))
	for i := 0; i < 3 && i < len(f); i++ {
		l[i], _ = strconv.ParseFloat(f[i], 64)
	}
	return l
}

// raiseNoFile lifts this process's soft RLIMIT_NOFILE to its hard limit;
// the children it starts inherit it (a Go child raises its own anyway, the
// demo agent and anything else does not).
func raiseNoFile() (uint64, error) {
	// syscall's, not x/sys/unix's: it tells os/exec not to give children
	// the limit the runtime found at start-up.
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, err
	}
	if l.Cur < l.Max {
		l.Cur = l.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
			return 0, err
		}
	}
	return l.Cur, nil
}
