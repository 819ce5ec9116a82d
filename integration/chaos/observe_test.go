package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"

	"github.com/runnerd/runnerd/integration/chaos/checker"
	"github.com/runnerd/runnerd/internal/boottime"
	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/sandbox/docker"
	"github.com/runnerd/runnerd/sandbox/supervisor"
	"github.com/runnerd/runnerd/wire"
)

// The docker backend's paths inside a container.
const (
	containerRunnerd = "/.runnerd/bin/runnerd"
	containerAgent   = "/demoagent"
)

// observer watches what the campaign did not start itself: turn children,
// supervisors, agents (by scanning /proc), the sandbox containers, and the
// agents' transcripts, which it reads while they are there — a LOST
// conversation's sandbox is removed with its transcript, so waiting for
// the end would lose the very prompts that matter.
type observer struct {
	w   *world
	eng *client.Client // nil without a docker host

	mu    sync.Mutex // guards the maps below: the loop and the final pass
	live  map[int]observed
	lines map[string]int       // transcript file → complete lines recorded
	boxes map[string]dockerBox // container id → its conversation, init pid and log file
	// logs: supervisor log file (by inode, so a rotated file is read to
	// its end, and its first line) → bytes read. The supervisors' records of their agents'
	// starts and exits, read as they are written, are what the checker
	// judges overlap on: a /proc scan misses short agents.
	logs map[uint64]logPos
	// boot0 and wall0: CLOCK_BOOTTIME and the wall clock read together,
	// to place the records' boottime_ns on the history's clock.
	boot0 boottime.Instant
	wall0 time.Time
}

// logPos is how far a log file was read, and its first line, which tells
// it from a later file with the same inode.
type logPos struct {
	off  int64
	head string
}

type observed struct {
	role, host, conv string
	container        string
}

type dockerBox struct {
	conv    string
	pid     int    // the container's init: our supervisor
	logPath string // the json-file log: the supervisor's stderr
}

func newObserver(w *world, eng *client.Client) *observer {
	return &observer{w: w, eng: eng, live: map[int]observed{}, lines: map[string]int{}, boxes: map[string]dockerBox{},
		logs: map[uint64]logPos{}, boot0: boottime.Now(), wall0: time.Now()}
}

// run scans every period until ctx ends.
func (o *observer) run(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for n := 0; ; n++ {
		o.pass(ctx, n%3 == 0)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pass scans once; withDocker also asks the engine for the containers.
func (o *observer) pass(ctx context.Context, withDocker bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if withDocker && o.eng != nil {
		o.listBoxes(ctx)
	}
	o.scanProcs()
	o.readSupervisorLogs()
	o.readTranscripts(ctx, withDocker)
}

func (o *observer) dockerHost() *host {
	for _, h := range o.w.hosts {
		if h.sandbox == "docker" {
			return h
		}
	}
	return nil
}

func (o *observer) listBoxes(ctx context.Context) {
	h := o.dockerHost()
	if h == nil {
		return
	}
	cs, err := o.eng.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", docker.LabelHost+"="+h.name))})
	if err != nil {
		return
	}
	for _, c := range cs {
		box := o.boxes[c.ID]
		box.conv = c.Labels[docker.LabelConversation]
		if c.State == "running" || box.logPath == "" {
			if info, err := o.eng.ContainerInspect(ctx, c.ID); err == nil && info.State != nil {
				box.pid, box.logPath = info.State.Pid, info.LogPath
			}
		}
		if c.State != "running" {
			box.pid = 0
		}
		o.boxes[c.ID] = box
	}
}

// scanProcs records the start of every process of ours that appeared and
// the exit of every one that went.
func (o *observer) scanProcs() {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	now := map[int]observed{}
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		if ob, ok := o.live[pid]; ok {
			if !procAlive(pid) {
				continue
			}
			// A turn child forks the process backend's supervisor: seen
			// between the fork and the exec, the supervisor was taken for
			// a child (and left at the end as a leaked one). Look again.
			if ob.role == checker.RoleChild {
				if again, ok := o.classify(pid); ok && again.role != ob.role {
					o.record(pid, ob, checker.ProcessExit)
					o.record(pid, again, checker.ProcessStart)
					ob = again
				}
			}
			now[pid] = ob
			continue
		}
		if ob, ok := o.classify(pid); ok {
			now[pid] = ob
			o.record(pid, ob, checker.ProcessStart)
		}
	}
	for pid, ob := range o.live {
		if _, ok := now[pid]; !ok {
			o.record(pid, ob, checker.ProcessExit)
		}
	}
	o.live = now
}

func (o *observer) record(pid int, ob observed, event string) {
	if ob.role == checker.RoleAgent {
		return // the supervisors' own records say when agents start and exit (readSupervisorLogs)
	}
	_ = o.w.hist.Write(checker.Record{Host: ob.host, ConversationID: ob.conv,
		Process: &checker.Process{Role: ob.role, Event: event, PID: pid, ContainerID: ob.container}})
}

// readSupervisorLogs records every supervisor record of an agent's start
// or exit (an ACP agent's turn: its prompt sent, its answer) written since
// the last pass: the process backend's STATE/sandboxes/CONV/supervisor.log
// and the Docker backend's container logs (json-file), each with the one
// rotated file before it. A log removed with its sandbox before a pass
// read it loses its tail; the checker's count of agents ran against
// judged shows that.
func (o *observer) readSupervisorLogs() {
	for _, h := range o.w.hosts {
		if h.sandbox != "process" {
			continue
		}
		files, _ := filepath.Glob(filepath.Join(h.stateDir, "sandboxes", "*", "supervisor.log"))
		for _, f := range files {
			conv := filepath.Base(filepath.Dir(f))
			o.readLog(h.name, conv, f+".1", false)
			o.readLog(h.name, conv, f, false)
		}
	}
	if h := o.dockerHost(); h != nil {
		for _, box := range o.boxes {
			if box.logPath != "" {
				o.readLog(h.name, box.conv, box.logPath+".1", true)
				o.readLog(h.name, box.conv, box.logPath, true)
			}
		}
	}
}

// readLog reads file's complete lines from where the last read ended;
// dockerJSON: each line is the json-file driver's {"log": line}.
func (o *observer) readLog(host, conv, file string, dockerJSON bool) {
	f, err := os.Open(file)
	if err != nil {
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return
	}
	pos := o.logs[st.Ino]
	if pos.off > 0 {
		// An inode freed (a rotated log removed) is soon another log's:
		// a file whose first line is not the one read is a new file.
		head := make([]byte, len(pos.head))
		if n, _ := f.ReadAt(head, 0); n != len(head) || string(head) != pos.head {
			pos = logPos{}
		}
	}
	if fi.Size() <= pos.off {
		return
	}
	b := make([]byte, fi.Size()-pos.off)
	n, _ := f.ReadAt(b, pos.off)
	b = b[:n]
	end := bytes.LastIndexByte(b, '\n')
	if end < 0 {
		return
	}
	if pos.off == 0 {
		pos.head = string(b[:bytes.IndexByte(b, '\n')+1])
	}
	pos.off += int64(end + 1)
	o.logs[st.Ino] = pos
	for _, line := range bytes.Split(b[:end], []byte("\n")) {
		if dockerJSON {
			var d struct {
				Log string `json:"log"`
			}
			if json.Unmarshal(line, &d) != nil {
				continue
			}
			line = []byte(d.Log)
		}
		o.supervisorRecord(host, conv, line)
	}
}

// supervisorRecord writes the history's record of one supervisor record,
// if it is of an agent's start or exit.
func (o *observer) supervisorRecord(host, conv string, line []byte) {
	var r struct {
		Msg        string `json:"msg"`
		Instance   string `json:"instance"`
		Generation uint64 `json:"generation"`
		PID        int    `json:"pid"`
		BootNS     int64  `json:"boottime_ns"`
		StartTicks int64  `json:"pid_start_ticks"`
	}
	if !bytes.Contains(line, []byte(`"boottime_ns"`)) || json.Unmarshal(line, &r) != nil || r.BootNS == 0 {
		return
	}
	var role, event string
	switch r.Msg {
	case supervisor.RecordAgentStarted:
		role, event = checker.RoleAgent, checker.ProcessStart
		// The pid's start time (USER_HZ ticks since boot, floored) is no
		// later than the process's start; the record may be later.
		if t := r.StartTicks * int64(time.Second/userHZ); r.StartTicks > 0 && t < r.BootNS {
			r.BootNS = t
		}
	case supervisor.RecordAgentExited:
		role, event = checker.RoleAgent, checker.ProcessExit
	case supervisor.RecordACPPromptSent:
		role, event = checker.RoleAgentTurn, checker.ProcessStart
	case supervisor.RecordACPPromptEnded:
		role, event = checker.RoleAgentTurn, checker.ProcessExit
	default:
		return
	}
	at := o.wall0.Add(boottime.Instant(r.BootNS).Sub(o.boot0))
	_ = o.w.hist.Write(checker.Record{Time: at, Host: host, ConversationID: conv,
		Process: &checker.Process{Role: role, Event: event, PID: r.PID, Activation: fmt.Sprintf("%s.%d", r.Instance, r.Generation)}})
}

// userHZ is the unit of /proc/PID/stat's start time on Linux.
const userHZ = 100

// procAlive: the pid runs and is not a zombie.
func procAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i > 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

func ppidOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0
	}
	p, _ := strconv.Atoi(f[1])
	return p
}

// classify says what pid is, if it is the campaign's.
func (o *observer) classify(pid int) (observed, bool) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(raw) == 0 || !procAlive(pid) {
		return observed{}, false
	}
	argv := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
	for _, h := range o.w.hosts {
		if argv[0] != h.runnerd || len(argv) < 2 {
			continue
		}
		switch argv[1] {
		case "turn":
			return observed{role: checker.RoleChild, host: h.name}, true
		case "supervise":
			return observed{role: checker.RoleSupervisor, host: h.name, conv: convOfSupervisor(h, argv)}, true
		}
		return observed{}, false // the daemon: the campaign records it itself
	}
	switch argv[0] {
	case bins.DemoAgent:
		cwd, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
		for _, h := range o.w.hosts {
			if rest, ok := strings.CutPrefix(cwd, filepath.Join(h.stateDir, "sandboxes")+"/"); ok {
				conv, _, _ := strings.Cut(rest, "/")
				return observed{role: checker.RoleAgent, host: h.name, conv: conv}, true
			}
		}
	case containerRunnerd, containerAgent:
		h := o.dockerHost()
		if h == nil {
			break
		}
		role := checker.RoleSupervisor
		if argv[0] == containerAgent {
			role = checker.RoleAgent
		}
		// The container's init (docker-init) is the supervisor's parent
		// and the agent's grandparent.
		for up, p := 0, ppidOf(pid); up < 3 && p > 1; up, p = up+1, ppidOf(p) {
			for id, box := range o.boxes {
				if box.pid == p {
					return observed{role: role, host: h.name, conv: box.conv, container: id}, true
				}
			}
		}
	}
	return observed{}, false
}

// convOfSupervisor reads the conversation from a process supervisor's
// --workspace (STATE/sandboxes/CONV/workspace).
func convOfSupervisor(h *host, argv []string) string {
	i := slices.Index(argv, "--workspace")
	if i < 0 || i+1 >= len(argv) {
		return ""
	}
	rest, ok := strings.CutPrefix(argv[i+1], filepath.Join(h.stateDir, "sandboxes")+"/")
	if !ok {
		return ""
	}
	conv, _, _ := strings.Cut(rest, "/")
	return conv
}

// readTranscripts records every complete transcript line not recorded yet.
func (o *observer) readTranscripts(ctx context.Context, withDocker bool) {
	for _, h := range o.w.hosts {
		if h.sandbox != "process" {
			continue
		}
		files, _ := filepath.Glob(filepath.Join(h.stateDir, "sandboxes", "*", "workspace", ".demoagent", "transcript.jsonl"))
		for _, f := range files {
			conv := filepath.Base(filepath.Dir(filepath.Dir(filepath.Dir(f))))
			o.readTranscript(h.name, conv, f)
		}
	}
	if !withDocker || o.eng == nil {
		return
	}
	h := o.dockerHost()
	vs, err := o.eng.VolumeList(ctx, volume.ListOptions{Filters: filters.NewArgs(filters.Arg("label", docker.LabelHost+"="+h.name))})
	if err != nil {
		return
	}
	for _, v := range vs.Volumes {
		if conv := v.Labels[docker.LabelConversation]; conv != "" && v.Mountpoint != "" {
			o.readTranscript(h.name, conv, filepath.Join(v.Mountpoint, ".demoagent", "transcript.jsonl"))
		}
	}
}

func (o *observer) readTranscript(host, conv, file string) {
	b, err := os.ReadFile(file)
	if err != nil {
		return
	}
	lines := strings.Split(string(b), "\n")
	lines = lines[:len(lines)-1] // the last is incomplete, or empty after the final newline
	for i := o.lines[file]; i < len(lines); i++ {
		var e struct {
			Turn   int64  `json:"turn"`
			Prompt string `json:"prompt"`
		}
		if json.Unmarshal([]byte(lines[i]), &e) != nil {
			continue
		}
		_ = o.w.hist.Write(checker.Record{Host: host, ConversationID: conv, Prompt: &checker.Prompt{Text: e.Prompt, NativeTurn: e.Turn}})
	}
	o.lines[file] = max(o.lines[file], len(lines))
}

// leftovers records what is still there: the campaign's processes and the
// docker host's containers.
func (o *observer) leftovers(ctx context.Context) {
	o.pass(ctx, true)
	o.mu.Lock()
	defer o.mu.Unlock()
	for pid, ob := range o.live {
		_ = o.w.hist.Write(checker.Record{Host: ob.host, ConversationID: ob.conv,
			Leftover: &checker.Leftover{What: checker.LeftoverProcess, Role: ob.role, PID: pid, ContainerID: ob.container}})
	}
	if h := o.dockerHost(); h != nil {
		for id, box := range o.boxes {
			if _, err := o.eng.ContainerInspect(ctx, id); err != nil {
				continue // removed since
			}
			_ = o.w.hist.Write(checker.Record{Host: h.name, ConversationID: box.conv,
				Leftover: &checker.Leftover{What: checker.LeftoverSandbox, Role: checker.RoleSandbox, ContainerID: id}})
		}
	}
}

// watchServers reads Admin → Servers every period until ctx ends and
// records each host's state when it changed (checker.Server): the
// replica properties' direct evidence of a host gone offline. Each read
// is bounded by a second, so that a stopped replica only delays it; the
// user calls move to the other replica when one is down.
func (o *observer) watchServers(ctx context.Context, period time.Duration) {
	last := map[string]string{} // host → state last recorded; this loop's own
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		var ss []wire.Server
		err := o.w.user(rctx, func(u *fleet.User) error { var err error; ss, err = u.Servers(rctx); return err })
		cancel()
		if err == nil {
			for _, s := range ss {
				if last[s.Name] != s.State {
					last[s.Name] = s.State
					_ = o.w.hist.Write(checker.Record{Host: s.Name,
						Server: &checker.Server{State: s.State, HeartbeatIntervalMS: s.HeartbeatIntervalMS}})
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
