package handover

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// One goroutine per child reads its frames and waits for its exit (issue 12
// §6): Turn.watch. Until the first of the two, it is parked on a per-turn
// epoll set holding the child's descriptor and its pidfd, which the
// runtime's poller watches like any other descriptor: no OS thread waits,
// and neither a child that closes its end and lives on nor one whose end a
// stray process holds open after its exit can keep the other news from the
// supervisor.

type readResult struct {
	f   Frame
	err error
}

// watch reads every frame of the child into frames, the read's end last,
// and closes t.exited once the child has exited (and, for Launch's child,
// is reaped). While both are to come it waits for either, the descriptor
// first when both are there. After the exit it reads what is left until EOF
// or the read deadline childExited sets; after the descriptor's end it
// waits for the exit alone.
func (t *Turn) watch(frames chan<- readResult) {
	exited := false
	for {
		if !exited && t.either.wait() {
			t.reap()
			exited = true
			continue
		}
		f, err := readFrameWhenReady(t.conn)
		frames <- readResult{f, err}
		if err != nil {
			break
		}
	}
	if !exited {
		_ = awaitExited(t.pidfd)
		t.reap()
	}
}

// reap ends what the child's exit leaves: the watch is closed, Launch's
// child is reaped (its status is the outcome's), whatever it left in its
// process group is killed, and t.exited is closed. The group id cannot be
// reused while a member lives, so the kill reaches only ours.
func (t *Turn) reap() {
	t.closeWatch()
	if t.cmd != nil {
		_ = t.cmd.Wait() // the outcome comes from ProcessState and the frames
		t.state = t.cmd.ProcessState
	}
	_ = unix.Kill(-t.pid, unix.SIGKILL)
	close(t.exited)
}

// closeWatch closes the epoll set and the pidfd, once the child has exited
// or when it is not supervised. A kill's SIGKILL still pending then finds
// the pidfd closed and never reaches another process (t.pidfd itself stays:
// that timer reads it).
func (t *Turn) closeWatch() {
	if t.either != nil {
		t.either.f.Close()
		t.either = nil
	}
	t.pidfd.Close()
}

// openWatch opens what watch waits on: a pidfd of t.pid and the epoll set
// of it and the descriptor. t.pid must not have been reaped and replaced:
// Launch's child before Wait, or the listener Reattach has just met.
func (t *Turn) openWatch() error {
	fd, err := unix.PidfdOpen(t.pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("handover: pidfd: %w", err)
	}
	t.pidfd = os.NewFile(uintptr(fd), "pidfd")
	if t.either, err = newEither(t.conn, t.pidfd); err != nil {
		t.pidfd.Close()
		t.pidfd = nil
		return err
	}
	return nil
}

// signal sends sig to the child by its pidfd, never to another process.
func (t *Turn) signal(sig unix.Signal) {
	if rc, err := t.pidfd.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { _ = unix.PidfdSendSignal(int(fd), sig, nil, 0) })
	}
}

// awaitExited returns once the process of pidfd has exited, waiting on the
// runtime's poller (a pidfd is readable from its process's exit on).
func awaitExited(pidfd *os.File) error {
	rc, err := pidfd.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Read(func(fd uintptr) bool {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		return err != nil || n > 0
	})
}

// either is the epoll set of a child's descriptor and its pidfd. Its own
// descriptor is non-blocking and on the runtime's poller, readable when
// either member is.
type either struct {
	f             *os.File
	rc            syscall.RawConn
	connFD, pidFD int32
}

func newEither(conn *net.UnixConn, pidfd *os.File) (*either, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("handover: epoll: %w", err)
	}
	if err := unix.SetNonblock(ep, true); err != nil { // so that os.NewFile puts it on the poller
		unix.Close(ep)
		return nil, fmt.Errorf("handover: epoll: %w", err)
	}
	e := &either{f: os.NewFile(uintptr(ep), "handover-watch")}
	add := func(c syscall.Conn, fd *int32) error {
		rc, err := c.SyscallConn()
		if err != nil {
			return err
		}
		cerr := rc.Control(func(u uintptr) {
			*fd = int32(u)
			err = unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, int(u), &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(u)})
		})
		return errors.Join(cerr, err)
	}
	if err = errors.Join(add(conn, &e.connFD), add(pidfd, &e.pidFD)); err == nil {
		e.rc, err = e.f.SyscallConn()
	}
	if err != nil {
		e.f.Close()
		return nil, fmt.Errorf("handover: epoll: %w", err)
	}
	return e, nil
}

// wait returns once the descriptor has something to read (a message, its
// end or an error) or the child has exited, and reports the exit only when
// the descriptor has nothing: frames already queued are read first. An
// error of the set itself, which nothing here causes, reports the
// descriptor: its read waits on its own.
func (e *either) wait() (exited bool) {
	var evs [2]unix.EpollEvent
	n := 0
	err := e.rc.Read(func(fd uintptr) bool {
		for {
			var err error
			n, err = unix.EpollWait(int(fd), evs[:], 0)
			switch {
			case errors.Is(err, unix.EINTR):
				continue // a zero timeout can still be interrupted: look again, never park on a missed one
			case err != nil:
				n = 0
				return true
			}
			return n > 0
		}
	})
	if err != nil {
		return false
	}
	for _, ev := range evs[:n] {
		if ev.Fd == e.connFD {
			return false
		}
		exited = exited || ev.Fd == e.pidFD
	}
	return exited
}
