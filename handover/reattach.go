package handover

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// EnvReattachFD names the child's re-attach socket (always 4) when
// Config.Reattach is set. The child unsets it.
const EnvReattachFD = "RUNNERD_HANDOVER_REATTACH_FD"

// reattachFD is where ExtraFiles[1] lands in the child.
const reattachFD = 4

// reattachVersions are the protocol versions of children this daemon
// re-attaches to: the children of the previous release too, once a release
// changes the frames (the first release with re-attachment is version 3).
var reattachVersions = []uint8{Version}

// ErrNoChild is Reattach's error when no child of the attempt waits on the
// socket: it is gone (or never accepted), and the turn is resolved without
// it (R31).
var ErrNoChild = errors.New("handover: no child waits to be re-attached")

// VersionError is Reattach's error for a child that speaks a protocol
// version this daemon does not; the child's process group has been sent
// SIGTERM and, KillGrace later, SIGKILL.
type VersionError struct{ Version uint8 }

func (e *VersionError) Error() string {
	return "handover: the child speaks protocol version " + strconv.Itoa(int(e.Version)) + ", not one this daemon re-attaches to"
}

// sockAddr runs f with an address for the socket at path: the path itself,
// or one through /proc/self/fd when it is longer than sun_path holds.
func sockAddr(path string, f func(addr string) error) error {
	if len(path) < len(unix.RawSockaddrUnix{}.Path) {
		return f(path)
	}
	dir, err := unix.Open(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("handover: re-attach socket directory: %w", err)
	}
	defer unix.Close(dir)
	return f("/proc/self/fd/" + strconv.Itoa(dir) + "/" + filepath.Base(path))
}

// bindReattach creates the re-attach socket at path, 0600, owned by the
// daemon. It is bound but not listening: the child listens, so that the
// credentials a connecting daemon sees are the child's.
func bindReattach(path string) (*os.File, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("handover: re-attach socket: %w", err)
	}
	_ = os.Remove(path) // a stale socket of this attempt id: no child listens on it
	err = sockAddr(path, func(addr string) error { return unix.Bind(fd, &unix.SockaddrUnix{Name: addr}) })
	if err == nil {
		err = os.Chmod(path, 0o600)
	}
	if err != nil {
		unix.Close(fd)
		_ = os.Remove(path)
		return nil, fmt.Errorf("handover: re-attach socket: %w", err)
	}
	return os.NewFile(uintptr(fd), "handover-reattach"), nil
}

// listenOn makes the child's inherited descriptor lfd its re-attach
// listener (a close-on-exec duplicate; lfd itself is closed).
func listenOn(lfd int) (*net.UnixListener, error) {
	if err := unix.Listen(lfd, 4); err != nil {
		unix.Close(lfd)
		return nil, fmt.Errorf("handover: listen on the re-attach socket: %w", err)
	}
	f := os.NewFile(uintptr(lfd), "handover-reattach")
	l, err := net.FileListener(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("handover: re-attach socket: %w", err)
	}
	ul, ok := l.(*net.UnixListener)
	if !ok {
		l.Close()
		return nil, errors.New("handover: the re-attach descriptor is not a unix socket")
	}
	ul.SetUnlinkOnClose(false) // the daemon owns the file
	return ul, nil
}

// peerCred is the uid and pid of conn's peer: for a connection to the
// re-attach socket, the child that listens on it.
func peerCred(conn *net.UnixConn) (uid, pid int, err error) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return 0, 0, err
	}
	var cred *unix.Ucred
	cerr := rc.Control(func(fd uintptr) {
		cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if cerr != nil {
		return 0, 0, cerr
	}
	if err != nil {
		return 0, 0, err
	}
	return int(cred.Uid), int(cred.Pid), nil
}

// dialReattach connects to the re-attach socket at path. The socket is
// non-blocking, so that a listener whose backlog is full (a child that
// does not accept: frozen) answers EAGAIN instead of holding the connect.
func dialReattach(path string) (*net.UnixConn, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	err = sockAddr(path, func(addr string) error { return unix.Connect(fd, &unix.SockaddrUnix{Name: addr}) })
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "handover-reattach")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, err
	}
	return c.(*net.UnixConn), nil
}

// Unattached is Reattach's error for a child that may still be running
// but could not be taken over now: it listens on the socket (or the socket
// could not even be reached: EMFILE) but cannot be watched — the pidfd or
// the epoll set could not be made (EMFILE, ENOMEM) — or it does not answer
// REATTACH within StopGrace (frozen, busy, its backlog full). None of that
// is evidence that it is gone: the caller keeps the turn and tries again
// while Alive says it may be running, and the child fences itself by its
// own lease deadline meanwhile (K5).
type Unattached struct {
	PID   int    // the listener's pid, 0 when the socket could not be reached
	start uint64 // its start time (/proc/<pid>/stat), 0 when it could not be read
	Err   error  // the cause; it may hold OS error text
}

func (e *Unattached) Error() string {
	return "handover: the child could not be re-attached (pid " + strconv.Itoa(e.PID) + "): " + e.Err.Error()
}

func (e *Unattached) Unwrap() error { return e.Err }

// Alive reports whether the child may still be running. It is false only
// on evidence that it has exited: no process of its pid, a zombie, or
// another process under its pid (a different start time). A pid it never
// learned, or a /proc it cannot read (EMFILE), is no such evidence.
func (e *Unattached) Alive() bool {
	if e.PID <= 0 {
		return true
	}
	if err := unix.Kill(e.PID, 0); errors.Is(err, unix.ESRCH) {
		return false
	}
	state, start, err := procStat(e.PID)
	switch {
	case errors.Is(err, os.ErrNotExist), errors.Is(err, unix.ESRCH):
		return false
	case err != nil:
		return true
	}
	return state != 'Z' && state != 'X' && (e.start == 0 || start == e.start)
}

// Kill sends SIGKILL to the child, by a pidfd whose process has the
// child's start time, and then to its process group; it does nothing
// when it cannot make sure the pid is still the child's (no pidfd, no
// start time, or another process under the pid). Call Alive to learn
// when the child is gone.
func (e *Unattached) Kill() {
	if e.PID <= 0 || e.start == 0 {
		return
	}
	fd, err := unix.PidfdOpen(e.PID, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	// Read after the pidfd is open: it pins the process, so a matching
	// start time proves it is the child.
	if _, start, err := procStat(e.PID); err != nil || start != e.start {
		return
	}
	if unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) == nil {
		// The group id cannot be reused while a member lives.
		_ = unix.Kill(-e.PID, unix.SIGKILL)
	}
}

// procStat reads the state and the start time (clock ticks since boot) of
// process pid from /proc/<pid>/stat.
func procStat(pid int) (state byte, start uint64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// "pid (comm) state ppid …": comm may hold anything, so fields are
	// counted from its closing parenthesis; the start time is field 22.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, errors.New("handover: unreadable /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 || len(f[0]) != 1 {
		return 0, 0, errors.New("handover: unreadable /proc stat")
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, 0, errors.New("handover: unreadable /proc stat")
	}
	return f[0][0], start, nil
}

// exited reports whether the process of pidfd has exited (a pidfd is
// readable from its process's exit on).
func exited(pidfd *os.File) bool {
	rc, err := pidfd.SyscallConn()
	if err != nil {
		return false
	}
	gone := false
	_ = rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		gone = err == nil && n > 0
	})
	return gone
}

// Reattach takes over the turn of an earlier daemon's child that waits on
// its re-attach socket cfg.Reattach (P5): it connects, checks that the
// child is of this user and runs echo's attempt in a protocol version this
// daemon speaks, hands it lease (just renewed: the child's deadline moves
// with it) and supervises it from then on like an accepted Turn of Launch;
// the child sends its newest PROGRESS and its RESULT again. cfg.Path and
// cfg.Args are not used; cfg.ExecutionTimeout is what is left of the
// turn's.
//
// ErrNoChild means there is evidence that no child of the attempt is
// there: nothing listens on the socket (ENOENT, ECONNREFUSED), the
// listener is not of this user, or the child exited during the handshake.
// An *Unattached is a child that may still be running but could not be
// taken over now: the caller tries again. A *VersionError is a child this
// daemon cannot speak to, which has been stopped.
func Reattach(ctx context.Context, cfg Config, echo Echo, lease Lease) (*Turn, error) {
	cfg = cfg.withDefaults()
	if cfg.Reattach == "" {
		return nil, errors.New("handover: Reattach without Config.Reattach")
	}
	body, err := encodeReattach(reattach{Echo: echo, Version: Version, Lease: lease})
	if err != nil {
		return nil, err
	}
	conn, err := dialReattach(cfg.Reattach)
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ECONNREFUSED):
		// No listener: the child is gone (its listener closes with it).
		return nil, fmt.Errorf("%w: %w", ErrNoChild, err)
	case err != nil:
		// EAGAIN (a full backlog: a listener that does not accept), EMFILE:
		// nothing says the child is gone.
		return nil, &Unattached{Err: fmt.Errorf("handover: connect to the re-attach socket: %w", err)}
	}
	uid, pid, err := peerCred(conn)
	if err != nil {
		conn.Close()
		return nil, &Unattached{Err: fmt.Errorf("handover: re-attach socket credentials: %w", err)}
	}
	if uid != os.Getuid() || pid <= 0 {
		conn.Close()
		return nil, fmt.Errorf("%w: the socket's listener is not a child of this user", ErrNoChild)
	}
	// Read while the listener holds its socket: the pid is the child's.
	_, start, _ := procStat(pid)
	// The pidfd is taken before the child hears of this daemon: one that
	// cannot be watched is left to its own deadline (K5) until the next
	// try, as if nobody had come.
	t := newTurn(cfg, echo, conn)
	t.pid, t.keep = pid, true
	if err := t.openWatch(); err != nil {
		conn.Close()
		return nil, &Unattached{PID: pid, start: start, Err: err}
	}
	conn.SetDeadline(time.Now().Add(cfg.StopGrace))
	var a attached
	buf := newReadBuffer()
	err = writeFrame(conn, FrameReattach, body)
	if err == nil {
		var f Frame
		if f, err = readFrame(conn, buf); err == nil && f.Type != FrameAttached {
			err = fmt.Errorf("%w: %s frame in answer to REATTACH", ErrMalformed, f.Type)
		}
		if err == nil {
			a, err = parseAttached(f.Body)
		}
	}
	if err == nil && a.Echo != echo {
		err = fmt.Errorf("%w: ATTACHED for another attempt", ErrMalformed)
	}
	if err != nil {
		// Only the child's exit is evidence: one that closes without an
		// answer may be on its way out, or may take the next daemon; one
		// that answers nothing within StopGrace may be frozen.
		gone := exited(t.pidfd)
		t.closeWatch()
		conn.Close()
		if gone {
			return nil, fmt.Errorf("%w: it exited: %w", ErrNoChild, err)
		}
		return nil, &Unattached{PID: pid, start: start, Err: err}
	}
	conn.SetDeadline(time.Time{})
	known := false
	for _, v := range reattachVersions {
		known = known || v == a.Version
	}
	t.orphaned = a.Orphaned
	if !known {
		t.kill()
		_ = awaitExited(t.pidfd)
		t.reap()
		conn.Close()
		return nil, &VersionError{Version: a.Version}
	}
	close(t.answered)
	go t.supervise(ctx, nil)
	return t, nil
}

// Orphaned is how long the child had been without a daemon when Reattach
// took it over; zero for a Turn of Launch.
func (t *Turn) Orphaned() time.Duration { return t.orphaned }
