package handover

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// EnvFD is the one environment variable the child gets from this package:
// the number of its handover descriptor (always 3). The child unsets it.
const EnvFD = "RUNNERD_HANDOVER_FD"

// childFD is where ExtraFiles[0] lands in the child.
const childFD = 3

// Defaults of Config.
const (
	DefaultExecutionTimeout = 3600 * time.Second // R5
	DefaultStopGrace        = 10 * time.Second
	DefaultKillGrace        = 10 * time.Second
)

// droppedEnv are variables that belong to the daemon alone: a child that saw
// them could notify systemd or take over its sockets.
var droppedEnv = [...]string{"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES", EnvFD, EnvReattachFD}

// Config describes how to start one child. Zero fields mean the default.
// It is a value: the runner copies a shared one and sets OnProgress per turn.
type Config struct {
	// Path is the child's executable, typically the daemon's own
	// os.Executable(); Args follow it (for example ["turn"]). Required.
	Path string
	Args []string
	// Env is the child's environment before filtering; nil means the
	// daemon's own. Daemon-only variables (NOTIFY_SOCKET, WATCHDOG_*,
	// LISTEN_*) are dropped and EnvFD is set.
	Env []string
	Dir string
	// Stdout and Stderr receive the child's output; nil discards it. An
	// *os.File is passed as is; any other writer goes through a pipe that
	// KillGrace bounds after the child exits.
	Stdout, Stderr io.Writer

	// ExecutionTimeout bounds the child's whole life from its start (R5),
	// default 3,600 s. When it passes the child is stopped; before ACCEPT
	// that is a failure, never a release (R34).
	ExecutionTimeout time.Duration
	// StopGrace is the time between STOP and SIGTERM to the child's
	// process group; KillGrace the time between SIGTERM and SIGKILL.
	StopGrace time.Duration
	KillGrace time.Duration
	// Reattach, if set, is the path of the turn's re-attach socket (in the
	// daemon's state directory; 0600, owned by the daemon). The child is
	// not tied to the daemon's life: one that has accepted goes on when the
	// daemon dies, fenced by its own lease deadline (K5), and waits there
	// for the next daemon's Reattach (P5). Without it the child ends its
	// turn when its descriptor reaches EOF. The file is removed once the
	// child is gone.
	Reattach string
	// OnResult, if set, receives the RESULT body on the supervising
	// goroutine when it arrives; once it returns the daemon tells the child
	// it has the result (KEPT), so a child with a re-attach socket keeps it
	// until then. The daemon persists it there.
	OnResult func(body []byte)

	// Started, if set, is called with the child's pid once the child
	// exists and before it is sent the payload: until then the child waits
	// and has started nothing, so whatever Started does to it (the runner
	// moves it into a systemd scope of its own) holds for everything the
	// turn starts. Launch waits for it.
	Started func(pid int)

	// OnProgress receives each PROGRESS body in order, on the turn's
	// supervising goroutine: it must not block for long.
	OnProgress func(body []byte)
	// Leases, if set, delivers the lease after each acknowledged renewal;
	// each goes to the child as a DEADLINE frame as soon as the payload is
	// delivered, before and after ACCEPT (K5). The sender should keep only
	// the newest pending value (the child keeps the latest anyway).
	Leases <-chan Lease
}

func (c Config) withDefaults() Config {
	if c.ExecutionTimeout <= 0 {
		c.ExecutionTimeout = DefaultExecutionTimeout
	}
	if c.StopGrace <= 0 {
		c.StopGrace = DefaultStopGrace
	}
	if c.KillGrace <= 0 {
		c.KillGrace = DefaultKillGrace
	}
	if c.Env == nil {
		c.Env = os.Environ()
	}
	return c
}

func childEnv(env []string, reattach bool) []string {
	out := make([]string, 0, len(env)+2)
next:
	for _, kv := range env {
		for _, d := range droppedEnv {
			if strings.HasPrefix(kv, d+"=") {
				continue next
			}
		}
		out = append(out, kv)
	}
	if reattach {
		out = append(out, EnvReattachFD+"="+strconv.Itoa(reattachFD))
	}
	return append(out, EnvFD+"="+strconv.Itoa(childFD))
}

// Outcome is what became of a child, as the parent can prove it.
type Outcome int

const (
	// Launch answers. The first three are proof that the child never
	// accepted the turn, and only they carry a Releasable (R33).
	OutcomeSpawnFailed        Outcome = iota + 1 // the process was not created
	OutcomePayloadUndelivered                    // the payload could not be written
	OutcomeDeclined                              // DECLINE, or the descriptor closed without ACCEPT
	// OutcomeUnconfirmed: no valid answer came while the child lived, and the
	// parent ended it (execution timeout, Stop, a protocol error such as a
	// wrong echo). That is no proof: a failure, never a release (R34).
	OutcomeUnconfirmed
	OutcomeAccepted // ACCEPT with the right echo: the turn is the child's

	// Ends of an accepted turn. They belong to the lease protocol (R35).
	OutcomeResult              // RESULT arrived
	OutcomeExitedWithoutResult // the child exited without RESULT
	OutcomeKilled              // a signal ended the child before RESULT
)

func (o Outcome) String() string {
	switch o {
	case OutcomeSpawnFailed:
		return "spawn_failed"
	case OutcomePayloadUndelivered:
		return "payload_undelivered"
	case OutcomeDeclined:
		return "declined"
	case OutcomeUnconfirmed:
		return "unconfirmed"
	case OutcomeAccepted:
		return "accepted"
	case OutcomeResult:
		return "result"
	case OutcomeExitedWithoutResult:
		return "exited_without_result"
	case OutcomeKilled:
		return "killed"
	}
	return "outcome(" + strconv.Itoa(int(o)) + ")"
}

// Classes the parent gives to pre-accept outcomes (a DECLINE brings its own).
const (
	ClassClosed           = "closed"            // descriptor closed without ACCEPT
	ClassExecutionTimeout = "execution_timeout" // R5
	ClassStopped          = "stopped"           // Stop or the launch context
	ClassBadEcho          = "bad_echo"          // ACCEPT for another payload
	ClassProtocol         = "protocol"          // any other protocol error
	ClassPayloadInvalid   = "payload_invalid"   // the payload could not be encoded
	ClassDescriptor       = "descriptor_error"  // reading the descriptor failed
)

// Releasable is the permission to give a claim back to the queue (R33,
// R36). Only NotAccepted.Release hands one out, and only for spawn failed,
// payload undelivered and declined. Other packages can build nothing but
// the zero value, which Valid reports as no permission.
type Releasable struct {
	outcome Outcome
	class   string
}

// Valid reports whether r came from a pre-accept outcome.
func (r Releasable) Valid() bool { return r.outcome != 0 }

// Outcome is the pre-accept outcome that allows the release.
func (r Releasable) Outcome() Outcome { return r.outcome }

// Class is the release call's class (wire.ReleaseRequest.Class):
// spawn_failed, payload_undelivered or declined:<class>. Empty if !Valid.
func (r Releasable) Class() string {
	switch r.outcome {
	case OutcomeSpawnFailed, OutcomePayloadUndelivered:
		return r.outcome.String()
	case OutcomeDeclined:
		return "declined:" + r.class
	}
	return ""
}

// NotAccepted is Launch's error when the child did not take the turn. The
// child is gone when Launch returns it.
type NotAccepted struct {
	Outcome Outcome // spawn failed, payload undelivered, declined or unconfirmed
	Class   string  // decline class, or the parent's reason class
	// State is the child's exit; nil when it never started.
	State *os.ProcessState
	// Err is the cause, if any. It may hold OS error text: records take
	// Outcome and Class, not Err.
	Err error
}

func (e *NotAccepted) Error() string {
	s := "handover: child did not accept: " + e.Outcome.String() + " (" + e.Class + ")"
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *NotAccepted) Unwrap() error { return e.Err }

// Release returns the permission to release the claim, and false when the
// outcome is no proof that the child never accepted.
func (e *NotAccepted) Release() (Releasable, bool) {
	switch e.Outcome {
	case OutcomeSpawnFailed, OutcomePayloadUndelivered, OutcomeDeclined:
		return Releasable{outcome: e.Outcome, class: e.Class}, true
	}
	return Releasable{}, false
}

// Ended is how an accepted turn ended. It offers no release: after ACCEPT
// the lease protocol decides (R35).
type Ended struct {
	Outcome Outcome // result, exited without result, or killed
	Result  []byte  // the RESULT body when Outcome is OutcomeResult
	// ExitCode is the child's exit status, -1 when a signal ended it.
	ExitCode int
	Signal   syscall.Signal
	Stopped  bool  // Stop or the launch context asked it to stop
	TimedOut bool  // the execution timeout stopped it (R5)
	Err      error // a protocol error from the child, if any
}

// Turn is a child that accepted its turn.
type Turn struct {
	cfg  Config
	echo Echo
	pid  int

	wmu  sync.Mutex // one frame at a time on the descriptor
	conn *net.UnixConn

	stopOnce  sync.Once
	stopReq   chan struct{}
	stopClass string // set before stopReq closes

	// The child and what watch waits on: Launch's child is reaped (cmd),
	// a re-attached one is not ours to reap (cmd nil).
	cmd      *exec.Cmd
	pidfd    *os.File  // the child's, on the runtime's poller; watch closes it after the exit
	either   *either   // the epoll set of conn and pidfd; watch's alone
	killOnce sync.Once // kill's SIGTERM and timer, once

	exited chan struct{} // closed by watch after the exit, Wait and the group kill
	state  *os.ProcessState

	answered    chan struct{} // closed on ACCEPT, or with notAccepted set
	notAccepted *NotAccepted

	keep     bool          // the child waits for KEPT after RESULT (it has a re-attach socket)
	orphaned time.Duration // how long it was without a daemon (Reattach)

	done  chan struct{} // closed when the child is gone and ended is set
	ended Ended
}

// PID is the child's process id, which is also its process group id.
func (t *Turn) PID() int { return t.pid }

// Stop asks the child to stop: a STOP frame, StopGrace later SIGTERM to its
// process group, KillGrace later SIGKILL. It returns at once; Wait or Done
// tell when the child is gone. Only the first call counts.
func (t *Turn) Stop() { t.StopWith(ClassStopped) }

// StopWith is Stop with the reason class the STOP frame carries to the
// child, for example "lease_lost" or "cancelled"; an invalid class is sent
// as "stopped".
func (t *Turn) StopWith(class string) {
	if validClass(class) != nil {
		class = ClassStopped
	}
	t.stopOnce.Do(func() {
		t.stopClass = class
		close(t.stopReq)
	})
}

// StopCause, as the cause of Launch's context (context.WithCancelCause),
// makes the STOP that the cancellation sends carry Class — "cancelled", say,
// for a user's cancel that came before ACCEPT — instead of "stopped". An
// invalid class, or any other cause, is sent as "stopped".
type StopCause struct{ Class string }

func (c StopCause) Error() string { return "handover: stop (" + c.Class + ")" }

// stopClassOf is the class of the STOP a cancelled ctx sends.
func stopClassOf(ctx context.Context) string {
	var c StopCause
	if errors.As(context.Cause(ctx), &c) && validClass(c.Class) == nil {
		return c.Class
	}
	return ClassStopped
}

// Done is closed when the child has exited and its descriptor is drained.
func (t *Turn) Done() <-chan struct{} { return t.done }

// Wait waits for the child to end and says how.
func (t *Turn) Wait() Ended {
	<-t.done
	return t.ended
}

// Launch starts the child, hands it the payload over its descriptor and
// waits for its answer. It returns a *Turn when the child accepted with the
// right echo; otherwise a *NotAccepted error, after the child is gone, whose
// Release says whether the claim may be given back. A live child that does
// not answer keeps Launch waiting until the execution timeout or ctx ends it
// (R34). Cancelling ctx stops the child like Turn.Stop, also after ACCEPT;
// with a StopCause the STOP carries its class, as Turn.StopWith's does.
//
// Launch marks every descriptor of the daemon from 3 up close-on-exec
// (close_range), so that one inherited without it cannot leak to a child.
func Launch(ctx context.Context, cfg Config, p Payload) (*Turn, error) {
	body, err := encodePayload(p)
	if err != nil {
		return nil, &NotAccepted{Outcome: OutcomePayloadUndelivered, Class: ClassPayloadInvalid, Err: err}
	}
	c, err := Prepare(cfg)
	if err != nil {
		return nil, err
	}
	return c.launch(ctx, p.Echo, body)
}

// spawn starts the child of cfg, which waits for its payload; a
// *NotAccepted (spawn failed) when it could not.
func spawn(cfg Config) (*Turn, error) {
	spawnFailed := func(class string, err error) (*Turn, error) {
		return nil, &NotAccepted{Outcome: OutcomeSpawnFailed, Class: class, Err: err}
	}
	if cfg.Path == "" {
		return spawnFailed("config", errors.New("handover: no executable path"))
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return spawnFailed("socketpair", fmt.Errorf("handover: socketpair: %w", err))
	}
	parentEnd := os.NewFile(uintptr(fds[0]), "handover-parent")
	childEnd := os.NewFile(uintptr(fds[1]), "handover-child")
	c, err := net.FileConn(parentEnd)
	parentEnd.Close()
	if err != nil {
		childEnd.Close()
		return spawnFailed("socketpair", fmt.Errorf("handover: wrap descriptor: %w", err))
	}
	conn := c.(*net.UnixConn)
	// Descriptors the daemon inherited without close-on-exec (from systemd,
	// say) would reach the child; Go opens everything else close-on-exec.
	if err := closeExecFrom(childFD); err != nil {
		conn.Close()
		childEnd.Close()
		return spawnFailed("fd_hygiene", err)
	}

	var lis *os.File
	if cfg.Reattach != "" {
		if lis, err = bindReattach(cfg.Reattach); err != nil {
			conn.Close()
			childEnd.Close()
			return spawnFailed("reattach_socket", err)
		}
	}

	cmd := exec.Command(cfg.Path, cfg.Args...)
	cmd.Env = childEnv(cfg.Env, lis != nil)
	cmd.Dir = cfg.Dir
	cmd.Stdout, cmd.Stderr = cfg.Stdout, cfg.Stderr
	cmd.ExtraFiles = []*os.File{childEnd}
	if lis != nil {
		cmd.ExtraFiles = append(cmd.ExtraFiles, lis)
	}
	// No parent-death signal: a child outlives its daemon and, with a
	// re-attach socket, waits for the next one (P5). Its own group, so
	// that a signal to the daemon's group does not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// WaitDelay bounds the copy of a non-file Stdout or Stderr once the
	// child has exited (a grandchild may hold the pipe).
	cmd.WaitDelay = cfg.KillGrace

	t := newTurn(cfg, Echo{}, conn)
	t.keep = lis != nil
	class, err := t.start(cmd)
	childEnd.Close() // from now on EOF means the child's end is closed
	if lis != nil {
		lis.Close() // the child's now
	}
	if err != nil {
		conn.Close()
		if cfg.Reattach != "" {
			_ = os.Remove(cfg.Reattach)
		}
		return spawnFailed(class, err)
	}
	return t, nil
}

// start starts the child on the caller's goroutine (no parent-death
// signal ties it to a thread) and opens what watch waits on. A child that
// cannot be watched is killed and reaped before it has anything: its
// payload comes later.
func (t *Turn) start(cmd *exec.Cmd) (class string, err error) {
	if err := cmd.Start(); err != nil {
		return "exec", fmt.Errorf("handover: start child: %w", err)
	}
	t.cmd, t.pid = cmd, cmd.Process.Pid
	if err := t.openWatch(); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return "watch", err
	}
	return "", nil
}

// kill ends the child: SIGTERM to its process group now, SIGKILL to the
// child by its pidfd KillGrace later, and watch kills the group once the
// child has exited. Once the child has exited it does nothing, and only the
// first call counts. It is what exec.CommandContext's Cancel and WaitDelay
// did, without the goroutine exec keeps per child to watch the context: a
// timer waits instead, and only once the end has begun.
func (t *Turn) kill() {
	select {
	case <-t.exited:
		return
	default:
	}
	t.killOnce.Do(func() {
		_ = unix.Kill(-t.pid, unix.SIGTERM)
		time.AfterFunc(t.cfg.KillGrace, func() {
			select {
			case <-t.exited:
			default:
				t.signal(unix.SIGKILL)
			}
		})
	})
}

func newTurn(cfg Config, echo Echo, conn *net.UnixConn) *Turn {
	return &Turn{
		cfg:      cfg,
		echo:     echo,
		conn:     conn,
		stopReq:  make(chan struct{}),
		exited:   make(chan struct{}),
		answered: make(chan struct{}),
		done:     make(chan struct{}),
	}
}

func waitStatus(ps *os.ProcessState) (syscall.WaitStatus, bool) {
	if ps == nil {
		return 0, false
	}
	ws, ok := ps.Sys().(syscall.WaitStatus)
	return ws, ok
}

// closeExecFrom marks every descriptor from fd on close-on-exec.
func closeExecFrom(fd int) error {
	err := unix.CloseRange(uint(fd), ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("handover: close_range: %w", err)
	}
	// Kernels before 5.11: walk /proc/self/fd.
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("handover: list descriptors: %w", err)
	}
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil || n < fd {
			continue
		}
		unix.CloseOnExec(n) // the directory's own descriptor is gone by now: EBADF is fine
	}
	return nil
}
