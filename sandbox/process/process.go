// Package process is the process sandbox backend, the embedded default: a
// conversation's sandbox is a directory under the state directory and a
// local, long-lived supervisor process ("runnerd supervise") serving it.
//
// It offers NO ISOLATION. The agent runs as the daemon's user, on the host's
// filesystem, network and process table; its workspace is an ordinary
// directory. Use it for the demo, for tests and for agents you would run on
// the host anyway; use the docker backend for anything else.
//
// The supervisor's state (the native turn boundary R31 verifies) is kept
// beside the workspace, not in it, so an agent that rewrites or wipes its
// workspace leaves it alone. It is NOT protected from an agent that means
// to change it: the agent is the same user and can write any file of the
// sandbox directory, and connect to the supervisor's socket.
//
// Layout, per conversation (directory mode 0700):
//
//	STATE/sandboxes/<conversation>/
//	    id               the sandbox identity, recorded with the control plane
//	    cluster-id       the cluster identity it was created under (K8), written before id
//	    workspace/       the agent's working directory and native session
//	    supervisor-state/ the supervisor's durable state (0700)
//	    supervisor.sock  the supervisor's socket
//	    supervisor.pid   the supervisor's pid (checked against its command line)
//	    supervisor.log   its records and the agent's stderr (one .1 kept)
//	    lock             flock(2): one Ensure or Remove at a time, across processes
//
// Everything that matters is on disk, so a fresh Backend (after a daemon
// restart) finds the same supervisors. Supervisors run in their own session
// and are not killed when the daemon or a turn child exits.
//
// Only the runner (and cmd) import this package.
package process

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/runnerd/runnerd/internal/atomicfile"
	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/internal/pidfd"
)

// Config configures the backend. Zero fields mean the default.
type Config struct {
	// StateDir is the daemon's state directory. Required; it must exist.
	StateDir string
	// Command is the argv prefix that starts a supervisor, e.g.
	// [os.Executable(), "supervise"]. Required; the executable is an
	// absolute path. The backend appends --socket, --workspace, --id and
	// --ready-fd. The supervisor inherits only stdin (/dev/null), its log
	// as stdout and stderr, and the ready pipe: a starter must keep its
	// other descriptors close-on-exec (an inherited handover descriptor
	// would outlive the turn child in the supervisor).
	Command []string
	// Env is the supervisor's whole environment, which its agents inherit
	// in part (PATH is searched for the agent command). Default: PATH and
	// LANG only, so no secret in the daemon's environment reaches an agent.
	Env []string
	// StartTimeout bounds waiting for a new supervisor to listen. Default 10 s.
	StartTimeout time.Duration
	// StopTimeout bounds waiting for a supervisor to exit after SIGTERM in
	// Remove before it is killed. Default 5 s.
	StopTimeout time.Duration
	// TeardownBudget is how long Stop and Remove have, from their kill,
	// to prove the supervisor and every process that descended from it
	// then gone (S6); what is still running after it is named in a
	// *sandbox.TeardownIncomplete. Default sandbox.DefaultTeardownBudget.
	TeardownBudget time.Duration
	// ProbeTimeout bounds the status probe of an existing supervisor; one
	// that does not answer in time is taken for hung and replaced (its
	// receipts are lost, R28). Default 5 s.
	ProbeTimeout time.Duration
	// Logger receives the backend's records. Default: discarded.
	Logger *slog.Logger
}

// Backend is the process backend. Its zero value is not usable; use New.
type Backend struct {
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	children map[int]*exec.Cmd // supervisors this process started, to reap
}

var (
	_ sandbox.Backend = (*Backend)(nil)
	_ sandbox.Stopper = (*Backend)(nil)
)

// New checks cfg and returns a backend.
func New(cfg Config) (*Backend, error) {
	if cfg.StateDir == "" || len(cfg.Command) == 0 || cfg.Command[0] == "" {
		return nil, errors.New("process backend: state directory and supervisor command are required")
	}
	if cfg.Env == nil {
		cfg.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"}
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 10 * time.Second
	}
	if cfg.StopTimeout <= 0 {
		cfg.StopTimeout = 5 * time.Second
	}
	if cfg.ProbeTimeout <= 0 {
		cfg.ProbeTimeout = 5 * time.Second
	}
	if cfg.TeardownBudget <= 0 {
		cfg.TeardownBudget = sandbox.DefaultTeardownBudget
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Backend{cfg: cfg, log: cfg.Logger, children: map[int]*exec.Cmd{}}, nil
}

// Name is sandbox.BackendProcess.
func (b *Backend) Name() string { return sandbox.BackendProcess }

// Dir is the directory of a conversation's sandbox.
func (b *Backend) Dir(conversationID string) string {
	return filepath.Join(b.cfg.StateDir, "sandboxes", conversationID)
}

// Workspace is the conversation's workspace directory.
func (b *Backend) Workspace(conversationID string) string {
	return filepath.Join(b.Dir(conversationID), "workspace")
}

// StateDir is the directory of the conversation's supervisor state.
func (b *Backend) StateDir(conversationID string) string {
	return filepath.Join(b.Dir(conversationID), "supervisor-state")
}

// SocketPath is the conversation's supervisor socket.
func (b *Backend) SocketPath(conversationID string) string {
	return filepath.Join(b.Dir(conversationID), "supervisor.sock")
}

// checkConversation accepts an id that can name a directory of its own:
// 1 to 128 of [A-Za-z0-9_.-], not starting with a dot. A loop, not a
// regexp: a package-level regexp with {0,127} costs every turn child and
// supervisor 1,700 allocations at start.
func checkConversation(id string) error {
	ok := len(id) >= 1 && len(id) <= 128 && id[0] != '.'
	for i := 0; ok && i < len(id); i++ {
		c := id[i]
		ok = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.'
	}
	if !ok {
		return fmt.Errorf("conversation id %q cannot name a directory", id)
	}
	return nil
}

// Preflight checks, without starting, creating or changing anything, that
// the supervisor command and the agent command can be found, that the state
// directory can hold sandboxes, and that the conversation's sandbox, if it
// exists, is readable.
func (b *Backend) Preflight(ctx context.Context, spec sandbox.Spec) error {
	if err := checkConversation(spec.ConversationID); err != nil {
		return &sandbox.PreflightError{Class: sandbox.ClassInvalidSpec, Err: err}
	}
	if !spec.Limits.IsZero() {
		// Limits: the supervisor and its agents stay in the
		// scope of the turn that started them (or the daemon's cgroup),
		// never a cgroup of the conversation's own; a limit declined here
		// is never silently dropped.
		return &sandbox.PreflightError{Class: sandbox.ClassLimitsUnsupported,
			Err: errors.New("the process backend applies no per-conversation limit: its supervisor runs in no cgroup of the conversation's own")}
	}
	if err := executable(b.cfg.Command[0]); err != nil {
		return &sandbox.PreflightError{Class: sandbox.ClassSupervisorMissing, Err: err}
	}
	if st, err := os.Stat(b.cfg.StateDir); err != nil || !st.IsDir() {
		return &sandbox.PreflightError{Class: sandbox.ClassStateDir, Err: errors.New("state directory missing")}
	}
	if err := unix.Access(b.cfg.StateDir, unix.W_OK|unix.X_OK); err != nil {
		return &sandbox.PreflightError{Class: sandbox.ClassStateDir, Err: fmt.Errorf("state directory not writable: %w", err)}
	}
	dir := b.Dir(spec.ConversationID)
	_, statErr := os.Stat(dir)
	exists := statErr == nil
	if statErr != nil && !errors.Is(statErr, fs.ErrNotExist) {
		return &sandbox.PreflightError{Class: sandbox.ClassSandboxBroken, Err: statErr}
	}
	if exists {
		if _, err := readID(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return &sandbox.PreflightError{Class: sandbox.ClassSandboxBroken, Err: err}
		}
		if st, err := os.Stat(b.Workspace(spec.ConversationID)); err == nil && !st.IsDir() {
			return &sandbox.PreflightError{Class: sandbox.ClassSandboxBroken, Err: errors.New("workspace is not a directory")}
		}
	}
	if len(spec.AgentCommand) == 0 || spec.AgentCommand[0] == "" {
		return &sandbox.PreflightError{Class: sandbox.ClassAgentMissing, Err: errors.New("empty agent command")}
	}
	agent := spec.AgentCommand[0]
	switch {
	case filepath.IsAbs(agent):
		if err := executable(agent); err != nil {
			return &sandbox.PreflightError{Class: sandbox.ClassAgentMissing, Err: err}
		}
	case strings.Contains(agent, "/"):
		// Relative to the workspace, which may not exist yet: the supervisor
		// will say so when it starts the turn.
		if exists {
			if err := executable(filepath.Join(b.Workspace(spec.ConversationID), agent)); err != nil {
				return &sandbox.PreflightError{Class: sandbox.ClassAgentMissing, Err: err}
			}
		}
	default:
		if !inPath(agent, envPath(b.cfg.Env)) {
			return &sandbox.PreflightError{Class: sandbox.ClassAgentMissing, Err: fmt.Errorf("%q not found in the supervisor's PATH", agent)}
		}
	}
	return ctx.Err()
}

// Ensure finds the conversation's supervisor or starts one over the
// conversation's workspace, creating the sandbox directory the first time.
func (b *Backend) Ensure(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	conv := spec.ConversationID
	if err := checkConversation(conv); err != nil {
		return sandbox.Sandbox{}, fmt.Errorf("ensure process sandbox: %w", err)
	}
	dir := b.Dir(conv)
	if err := os.MkdirAll(b.Workspace(conv), 0o700); err != nil {
		return sandbox.Sandbox{}, fmt.Errorf("ensure process sandbox: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return sandbox.Sandbox{}, fmt.Errorf("ensure process sandbox: %w", err)
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return sandbox.Sandbox{}, fmt.Errorf("ensure process sandbox: %w", err)
	}
	defer unlock()

	id, err := readID(dir)
	if errors.Is(err, fs.ErrNotExist) {
		// A new sandbox: the cluster that granted its first turn is
		// recorded before its id, so a sandbox with an id made by this
		// build always names its cluster (K8 per sandbox). One found with
		// an id keeps what it recorded, or nothing (made by an earlier
		// release: judged under the host's pin).
		if err = writeCluster(dir, spec.Cluster); err == nil {
			id, err = newID(dir)
		}
	}
	if err != nil {
		return sandbox.Sandbox{}, fmt.Errorf("ensure process sandbox: %w", err)
	}
	sb := sandbox.Sandbox{Backend: sandbox.BackendProcess, ID: id, Socket: b.SocketPath(conv)}

	pctx, cancel := context.WithTimeout(ctx, b.cfg.ProbeTimeout)
	st, err := sb.Client().Status(pctx)
	cancel()
	switch {
	case err == nil && st.ID != id:
		return sandbox.Sandbox{}, fmt.Errorf("ensure process sandbox: the supervisor on the socket serves %q, not %q", st.ID, id)
	case err == nil && b.legacySupervisor(dir, sb.Socket):
		// Started by an earlier release, with its state in the
		// workspace: replace it (its receipts go, R28), so the state moves
		// out of the agent's way below.
		recordReplaced(b.log, "legacy_state_layout")
	case err == nil && st.Version < sandbox.ProtocolVersion && !st.Busy:
		// Started by an earlier release: it does not know what this
		// build's turns ask of it (the lease deadline, interrupt, the
		// retained record). Idle, it is replaced over the same workspace
		// and state; its in-memory receipts go (R28), its recorded
		// boundary stays.
		recordReplaced(b.log, "outdated_protocol")
	case err == nil:
		// Busy (an agent of a turn it still runs, which the next
		// activation fences) or current: used at its own version.
		if st.Version < sandbox.ProtocolVersion {
			recordOutdatedKept(b.log, st.Version)
		}
		sb.Version = st.Version
		return sb, nil
	case ctx.Err() != nil:
		return sandbox.Sandbox{}, fmt.Errorf("ensure process sandbox: %w", ctx.Err())
	}
	// No answer (whatever supervisor the pid file names is dead or hung),
	// or an old supervisor to replace: SIGTERM lets an idle one exit
	// cleanly, a hung one is killed after StopTimeout.
	grace := time.Duration(0)
	if err == nil {
		grace = b.cfg.StopTimeout
	}
	b.stopRecorded(dir, sb.Socket, grace)
	if moved, err := sandbox.AdoptLegacyState(b.Workspace(conv), b.StateDir(conv)); err != nil {
		return sandbox.Sandbox{}, fmt.Errorf("ensure process sandbox: %w", err)
	} else if moved {
		recordStateAdopted(b.log)
	}
	if err := b.start(ctx, conv, id); err != nil {
		return sandbox.Sandbox{}, fmt.Errorf("ensure process sandbox: %w", err)
	}
	pctx, cancel = context.WithTimeout(ctx, b.cfg.ProbeTimeout)
	st, err = sb.Client().Status(pctx)
	cancel()
	if err != nil {
		return sandbox.Sandbox{}, fmt.Errorf("ensure process sandbox: the new supervisor: %w", err)
	}
	sb.Version, sb.Created = st.Version, true
	return sb, nil
}

// Remove stops the conversation's supervisor (SIGTERM, which stops its
// agent; SIGKILL after StopTimeout) and deletes its directory. A process of
// the sandbox still running TeardownBudget after the kill began makes it
// return a *sandbox.TeardownIncomplete naming it, the directory deleted
// all the same (S6).
func (b *Backend) Remove(ctx context.Context, conversationID string) error {
	if err := checkConversation(conversationID); err != nil {
		return fmt.Errorf("remove process sandbox: %w", err)
	}
	dir := b.Dir(conversationID)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return fmt.Errorf("remove process sandbox: %w", err)
	}
	defer unlock()
	torn := b.stopRecorded(dir, b.SocketPath(conversationID), b.cfg.StopTimeout)
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove process sandbox: %w", err)
	}
	recordRemoved(b.log)
	if torn != nil {
		return fmt.Errorf("remove process sandbox: %w", torn)
	}
	return ctx.Err()
}

// Stop makes the conversation's supervisor exit (SIGTERM: it interrupts a
// turn it runs, which by idle's answer it does not, and ends its ACP agent;
// SIGKILL after StopTimeout) and keeps everything else: the sandbox id, the
// workspace and the supervisor's state. The next Ensure starts a
// supervisor over them (sandbox.Stopper). idle is asked under the
// conversation's lock, after the supervisor was found running; a
// supervisor that reports a turn running is left alone (sandbox.ErrBusy).
// A process of the sandbox still running TeardownBudget after the kill
// began — the supervisor, or one that descended from it then and escaped
// its kill — makes it return true and a *sandbox.TeardownIncomplete
// naming it (S6).
func (b *Backend) Stop(ctx context.Context, conversationID string, idle func() bool) (bool, error) {
	if err := checkConversation(conversationID); err != nil {
		return false, fmt.Errorf("stop process sandbox: %w", err)
	}
	dir := b.Dir(conversationID)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return false, fmt.Errorf("stop process sandbox: %w", err)
	}
	defer unlock()
	socket := b.SocketPath(conversationID)
	raw, err := os.ReadFile(filepath.Join(dir, "supervisor.pid"))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("stop process sandbox: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil || pid <= 0 || !servesSocket(pid, socket) {
		return false, nil // no supervisor of this sandbox runs
	}
	if !idle() {
		return false, nil
	}
	pctx, cancel := context.WithTimeout(ctx, b.cfg.ProbeTimeout)
	st, err := (&sandbox.Client{Socket: socket}).Status(pctx)
	cancel()
	if err == nil && st.Busy {
		return false, fmt.Errorf("stop process sandbox: %w", sandbox.ErrBusy)
	}
	if err == nil && st.Unloadable {
		return false, fmt.Errorf("stop process sandbox: its agent's session lives only in the running agent: %w", sandbox.ErrSessionNotLoadable)
	}
	// A supervisor that does not answer is hung, and Ensure would replace
	// it anyway: it is stopped the same way.
	torn := b.teardown(pid, b.cfg.StopTimeout)
	recordStopped(b.log, pid)
	if torn != nil {
		return true, fmt.Errorf("stop process sandbox: %w", torn)
	}
	return true, ctx.Err()
}

// Conversations lists, sorted, the conversations that have a sandbox
// directory under STATE/sandboxes, whether or not their supervisor runs.
// The runner's sandbox sweep asks the control plane about each. Entries
// that cannot name a conversation (files, odd names) are not listed.
func (b *Backend) Conversations(ctx context.Context) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(b.cfg.StateDir, "sandboxes"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list process sandboxes: %w", err)
	}
	var out []string
	for _, e := range ents { // ReadDir sorts by name
		if e.IsDir() && checkConversation(e.Name()) == nil {
			out = append(out, e.Name())
		}
	}
	return out, ctx.Err()
}

// Listed lists, sorted, the conversations that have a sandbox directory
// (as Conversations) with the cluster identity each was created under, ""
// when it recorded none. The runner's sandbox sweep judges each only by
// that cluster's answer. A cluster file that cannot be read lists the
// sandbox with an identity no control plane has, so nothing removes it.
func (b *Backend) Listed(ctx context.Context) ([]sandbox.Listed, error) {
	convs, err := b.Conversations(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]sandbox.Listed, 0, len(convs))
	for _, c := range convs {
		out = append(out, sandbox.Listed{ConversationID: c, Cluster: readCluster(b.Dir(c))})
	}
	return out, ctx.Err()
}

// CollectTeardownRecords returns, and removes, the records of the
// teardowns of its turns' agent trees the conversation's supervisor could
// not prove (sandbox.TeardownRecordsDir, S6).
func (b *Backend) CollectTeardownRecords(ctx context.Context, conversationID string) ([]sandbox.TeardownRecord, error) {
	if err := checkConversation(conversationID); err != nil {
		return nil, err
	}
	recs, err := sandbox.CollectTeardownRecords(b.StateDir(conversationID))
	if err != nil {
		return recs, fmt.Errorf("collect teardown records: %w", err)
	}
	return recs, ctx.Err()
}

// clusterFile is, in a sandbox directory, the cluster identity it was
// created under.
const clusterFile = "cluster-id"

// writeCluster records cluster in a new sandbox's directory, durably; ""
// (a control plane that sends none) records nothing.
func writeCluster(dir, cluster string) error {
	if cluster == "" {
		return nil
	}
	if strings.ContainsAny(cluster, " \t\n/") {
		return fmt.Errorf("cluster identity %q cannot be recorded", cluster)
	}
	return atomicfile.Write(filepath.Join(dir, clusterFile), []byte(cluster+"\n"), 0o600)
}

// readCluster is the sandbox's recorded cluster: "" when it recorded
// none, ClusterUnreadable when the file is there but unusable.
func readCluster(dir string) string {
	raw, err := os.ReadFile(filepath.Join(dir, clusterFile))
	if errors.Is(err, fs.ErrNotExist) {
		return ""
	}
	id := strings.TrimSpace(string(raw))
	if err != nil || id == "" || strings.ContainsAny(id, " \t\n/") {
		return sandbox.ClusterUnreadable
	}
	return id
}

// start starts a supervisor and waits until it says it listens.
func (b *Backend) start(ctx context.Context, conv, id string) error {
	dir := b.Dir(conv)
	logPath := filepath.Join(dir, "supervisor.log")
	_ = os.Rename(logPath, logPath+".1")
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logFile.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer readyR.Close()

	// --subreaper: whatever an agent leaves behind, however it detached
	// (setsid, a double fork), is reparented to the supervisor, not to
	// init, so it stays in the tree a teardown holds and proves gone (S6).
	args := append(append([]string(nil), b.cfg.Command[1:]...),
		"--socket", b.SocketPath(conv), "--workspace", b.Workspace(conv), "--state", b.StateDir(conv), "--id", id, "--ready-fd", "3",
		"--subreaper")
	cmd := exec.Command(b.cfg.Command[0], args...)
	cmd.Dir = dir
	cmd.Env = b.cfg.Env
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.ExtraFiles = []*os.File{readyW}
	// Its own session: no signal to the daemon's or a turn child's process
	// group reaches it, and it has no controlling terminal.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	readyW.Close()
	if err != nil {
		recordStartFailed(b.log, "spawn")
		return fmt.Errorf("start supervisor: %w", err)
	}
	pid := cmd.Process.Pid
	b.mu.Lock()
	b.children[pid] = cmd
	b.mu.Unlock()
	if err := atomicfile.Write(filepath.Join(dir, "supervisor.pid"), []byte(strconv.Itoa(pid)+"\n"), 0o600); err != nil {
		b.kill(pid, 0)
		return fmt.Errorf("record supervisor pid: %w", err)
	}

	deadline := time.Now().Add(b.cfg.StartTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = readyR.SetReadDeadline(deadline)
	buf := make([]byte, len("ready\n"))
	n, _ := readFull(readyR, buf)
	if string(buf[:n]) != "ready\n" {
		b.kill(pid, 0)
		recordStartFailed(b.log, "not_ready")
		return fmt.Errorf("supervisor did not become ready (see %s)", logPath)
	}
	recordStarted(b.log, pid)
	return nil
}

// stopRecorded stops the supervisor the pid file names, if that process
// is still a supervisor of this socket: SIGTERM and up to grace for it to
// exit, then SIGKILL; see teardown.
func (b *Backend) stopRecorded(dir, socket string, grace time.Duration) *sandbox.TeardownIncomplete {
	raw, err := os.ReadFile(filepath.Join(dir, "supervisor.pid"))
	if err != nil {
		return nil
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil || pid <= 0 || !servesSocket(pid, socket) {
		b.reap(pid)
		return nil
	}
	return b.teardown(pid, grace)
}

// teardown kills supervisor pid (kill) and proves it gone with every
// process that descended from it when the teardown began — its agents and
// theirs, in whatever process group or session — each held by a pidfd
// from before the kill, so no pid reused since is taken for a survivor
// (S6). The supervisor's exit kills its agents' process groups (and
// Pdeathsig theirs leaders); a process that left them (setsid, setpgid)
// is not killed by it, and is named if it still runs TeardownBudget after
// the kill began. Without a cgroup, a process that double-forked out of
// the tree before the teardown is outside this proof.
func (b *Backend) teardown(pid int, grace time.Duration) *sandbox.TeardownIncomplete {
	begin := time.Now()
	held, err := pidfd.HoldTree(pid)
	if err != nil {
		// /proc unreadable or out of descriptors: the supervisor alone,
		// which kill waits for.
		b.log.Warn(RecordTeardownUnheld, slog.String("backend", sandbox.BackendProcess), slog.Int("pid", pid), slog.String("error", err.Error()))
		held = &pidfd.Held{}
	}
	b.kill(pid, grace)
	if left := held.Wait(begin.Add(b.cfg.TeardownBudget)); len(left) > 0 {
		return &sandbox.TeardownIncomplete{PIDs: left, Budget: b.cfg.TeardownBudget}
	}
	return nil
}

// kill ends pid (SIGTERM first when grace > 0) and waits until it is gone.
func (b *Backend) kill(pid int, grace time.Duration) {
	if grace > 0 {
		_ = unix.Kill(pid, unix.SIGTERM)
		if pidfd.WaitExit(pid, grace) == nil {
			b.reap(pid)
			return
		}
	}
	_ = unix.Kill(pid, unix.SIGKILL)
	_ = pidfd.WaitExit(pid, b.cfg.StopTimeout)
	b.reap(pid)
}

// reap waits for a supervisor this process started, so it leaves no zombie.
func (b *Backend) reap(pid int) {
	b.mu.Lock()
	cmd := b.children[pid]
	delete(b.children, pid)
	b.mu.Unlock()
	if cmd != nil {
		_ = cmd.Wait()
	}
}

// servesSocket reports whether pid is alive and was started with
// "--socket socket": a recycled pid is never signalled.
func servesSocket(pid int, socket string) bool {
	args := cmdline(pid)
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--socket" && args[i+1] == socket {
			return true
		}
	}
	return false
}

// legacySupervisor reports whether the supervisor the pid file names was
// started without --state: by the previous release, which kept its state
// in the workspace.
func (b *Backend) legacySupervisor(dir, socket string) bool {
	raw, err := os.ReadFile(filepath.Join(dir, "supervisor.pid"))
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil || !servesSocket(pid, socket) {
		return false
	}
	return !slices.Contains(cmdline(pid), "--state")
}

func cmdline(pid int) []string {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
}

func lockDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	// Held only while a supervisor is found or started (StartTimeout at most).
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock sandbox: %w", err)
	}
	return func() {
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
	}, nil
}

func readID(dir string) (string, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "id"))
	if err != nil {
		return "", err
	}
	id := strings.TrimSpace(string(raw))
	if id == "" {
		return "", errors.New("sandbox id file is empty")
	}
	return id, nil
}

func newID(dir string) (string, error) {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	id := "proc-" + hex.EncodeToString(b)
	return id, atomicfile.Write(filepath.Join(dir, "id"), []byte(id+"\n"), 0o600)
}

func readFull(f *os.File, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := f.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func executable(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("%s is not executable", path)
	}
	return nil
}

func envPath(env []string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			return v
		}
	}
	return ""
}

func inPath(name, path string) bool {
	for _, dir := range filepath.SplitList(path) {
		if dir != "" && executable(filepath.Join(dir, name)) == nil {
			return true
		}
	}
	return false
}

// Record names of the process backend.
const (
	RecordSupervisorStarted     = "sandbox_supervisor_started"
	RecordSupervisorStartFailed = "sandbox_supervisor_start_failed"
	RecordRemoved               = "sandbox_removed"
	RecordSupervisorStopped     = "sandbox_supervisor_stopped"  // Stop: the supervisor exited, its sandbox kept (idle eviction)
	RecordSupervisorReplaced    = "sandbox_supervisor_replaced" // a running supervisor was stopped for a new one, and why
	RecordStateAdopted          = "sandbox_state_adopted"       // the previous release's state moved out of the workspace
	RecordSupervisorOutdated    = "sandbox_supervisor_outdated" // an older supervisor kept for a turn: its features only
	// RecordTeardownUnheld: the processes descending from a supervisor
	// could not be held before its kill; only the supervisor's exit is proven.
	RecordTeardownUnheld = "sandbox_teardown_unheld"
)

func recordReplaced(l *slog.Logger, reason string) {
	l.Info(RecordSupervisorReplaced, slog.String("backend", sandbox.BackendProcess), slog.String("reason", reason))
}

// recordOutdatedKept: the supervisor speaks an older protocol and was busy,
// so it stays for this turn, which runs with that version's features.
func recordOutdatedKept(l *slog.Logger, version int) {
	l.Warn(RecordSupervisorOutdated, slog.String("backend", sandbox.BackendProcess),
		slog.Int("version", version), slog.Int("want_version", sandbox.ProtocolVersion), slog.String("reason", "busy"))
}

func recordStateAdopted(l *slog.Logger) {
	l.Info(RecordStateAdopted, slog.String("backend", sandbox.BackendProcess))
}

func recordStarted(l *slog.Logger, pid int) {
	l.Info(RecordSupervisorStarted, slog.String("backend", sandbox.BackendProcess), slog.Int("pid", pid))
}

func recordStartFailed(l *slog.Logger, class string) {
	l.Error(RecordSupervisorStartFailed, slog.String("backend", sandbox.BackendProcess), slog.String("class", class))
}

func recordStopped(l *slog.Logger, pid int) {
	l.Info(RecordSupervisorStopped, slog.String("backend", sandbox.BackendProcess), slog.Int("pid", pid))
}

func recordRemoved(l *slog.Logger) {
	l.Info(RecordRemoved, slog.String("backend", sandbox.BackendProcess))
}
