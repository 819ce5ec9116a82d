package handover

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/runnerd/runnerd/internal/boottime"
)

// ErrParentGone is the child's stop cause when its descriptor reached EOF:
// the daemon died (or dropped the turn), and nothing renews the lease.
var ErrParentGone = errors.New("handover: parent gone")

// ErrStopRequested is the stop cause when the parent sent STOP; the cause is
// a *StopError that says why.
var ErrStopRequested = errors.New("handover: stop requested")

// StopError is the cause of a STOP: Class is the parent's reason class.
type StopError struct{ Class string }

func (e *StopError) Error() string        { return "handover: stop requested: " + e.Class }
func (e *StopError) Is(target error) bool { return target == ErrStopRequested }

// ErrLeaseExpired is the cause of Child.Deadlines when the lease deadline
// passed: no acknowledged renewal reached the child in time, so the lease
// may be gone. The turn must stop its agent and write nothing more (K5).
var ErrLeaseExpired = errors.New("handover: lease deadline passed")

// ErrExecutionDeadline is the cause of Child.Deadlines when the execution
// deadline of the payload passed (R5, K6).
var ErrExecutionDeadline = errors.New("handover: execution deadline passed")

// ErrOutOfOrder is returned by a Child method called where the protocol
// does not allow it (PROGRESS before ACCEPT, a second RESULT, …).
var ErrOutOfOrder = errors.New("handover: frame out of order")

// childPhase is where the child's answer stands. It only moves forward:
// open, then declined, or accepted and then resulted.
type childPhase int

const (
	childOpen     childPhase = iota // the payload is read; no answer sent
	childDeclined                   // DECLINE sent: the turn is not ours
	childAccepted                   // ACCEPT sent: the turn is ours (R35)
	childResulted                   // RESULT sent after ACCEPT
)

// Child is the child's end of the handover: the payload it was given and
// the frames it may send. Its methods are safe for concurrent use.
type Child struct {
	payload Payload

	ctx    context.Context
	cancel context.CancelCauseFunc

	// deadlines ends when the lease or the execution deadline passes.
	deadlines   context.Context
	endDeadline context.CancelCauseFunc
	leaseMoved  chan struct{} // one pending wake-up of the watcher
	leaseNews   chan struct{} // one pending notice for LeaseChanged

	// lis is the re-attach socket, nil without one: after ACCEPT a child
	// whose daemon is gone waits on it for the next daemon (P5).
	lis *net.UnixListener

	mu            sync.Mutex // guards conn, phase, the lease, the kept frames and writes
	conn          *net.UnixConn
	phase         childPhase
	lease         Lease            // the one with the latest Sent
	orphanedAt    boottime.Instant // when the daemon went away; zero while attached
	lastProgress  []byte           // sent again to a daemon that re-attaches
	pendingResult []byte           // a RESULT the daemon has not said it kept

	kept        chan struct{} // closed when the daemon kept the RESULT (KEPT)
	closeOnce   sync.Once
	closing     chan struct{} // closed by Close: the watcher ends
	readers     sync.WaitGroup
	watcherDone chan struct{}
}

// OpenFromEnv opens the descriptor named by EnvFD and unsets the variable,
// so that nothing the child starts sees it. Only the child's main calls it.
func OpenFromEnv() (*Child, error) {
	v, ok := os.LookupEnv(EnvFD)
	os.Unsetenv(EnvFD)
	rv, reattachable := os.LookupEnv(EnvReattachFD)
	os.Unsetenv(EnvReattachFD)
	if !ok {
		return nil, fmt.Errorf("handover: %s is not set: not started by the handover parent", EnvFD)
	}
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("handover: %s=%q is not a descriptor number above 2", EnvFD, v)
	}
	lfd := -1
	if reattachable {
		if lfd, err = strconv.Atoi(rv); err != nil || lfd < 3 || lfd == fd {
			return nil, fmt.Errorf("handover: %s=%q is not another descriptor number above 2", EnvReattachFD, rv)
		}
	}
	return open(fd, lfd)
}

// OpenFD takes over descriptor fd, which must be the child's end of a
// SOCK_SEQPACKET socket pair, and reads the PAYLOAD. fd itself is closed:
// the Child holds a close-on-exec duplicate, so no process the child starts
// inherits the descriptor and EOF stays a faithful sign for the parent.
// When the parent is already gone the error is ErrParentGone.
func OpenFD(fd int) (*Child, error) { return open(fd, -1) }

// open is OpenFD with the re-attach socket lfd (-1: none), a bound
// SOCK_SEQPACKET socket the child listens on: the listener's credentials,
// which a connecting daemon checks, are then the child's own.
func open(fd, lfd int) (*Child, error) {
	var lis *net.UnixListener
	if lfd >= 0 {
		var err error
		if lis, err = listenOn(lfd); err != nil {
			unix.Close(fd)
			return nil, err
		}
	}
	ch, err := openConn(fd)
	if err != nil {
		if lis != nil {
			lis.Close()
		}
		return nil, err
	}
	ch.lis = lis
	ch.readers.Add(1)
	go ch.readLoop(ch.conn, newReadBuffer())
	return ch, nil
}

func openConn(fd int) (*Child, error) {
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return nil, fmt.Errorf("handover: descriptor %d: %w", fd, err)
	}
	if typ != unix.SOCK_SEQPACKET {
		return nil, fmt.Errorf("handover: descriptor %d is a socket of type %d, want SOCK_SEQPACKET", fd, typ)
	}
	// The alarm first, so that its descriptor never takes fd's number.
	alarm, err := boottime.NewAlarm()
	if err != nil {
		return nil, fmt.Errorf("handover: %w", err)
	}
	f := os.NewFile(uintptr(fd), "handover")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		alarm.Close()
		return nil, fmt.Errorf("handover: descriptor %d: %w", fd, err)
	}
	conn := c.(*net.UnixConn)
	buf := newReadBuffer()
	fr, err := readFrame(conn, buf)
	if err == io.EOF {
		conn.Close()
		alarm.Close()
		return nil, ErrParentGone
	}
	if err == nil && fr.Type != FramePayload {
		err = fmt.Errorf("handover: first frame is %s, want PAYLOAD", fr.Type)
	}
	var p Payload
	if err == nil {
		p, err = parsePayload(fr.Body)
	}
	if err != nil {
		conn.Close()
		alarm.Close()
		return nil, fmt.Errorf("handover: read payload: %w", err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	dctx, dcancel := context.WithCancelCause(context.Background())
	ch := &Child{
		conn: conn, payload: p, ctx: ctx, cancel: cancel,
		deadlines: dctx, endDeadline: dcancel, lease: p.Lease,
		leaseMoved: make(chan struct{}, 1), leaseNews: make(chan struct{}, 1),
		kept: make(chan struct{}), closing: make(chan struct{}), watcherDone: make(chan struct{}),
	}
	go ch.watch(alarm)
	return ch, nil
}

// watch ends Deadlines when CLOCK_BOOTTIME reaches the lease deadline or
// the execution deadline, whichever comes first; a DEADLINE frame moves the
// lease's. It returns once Deadlines is done or the Child is closed.
func (c *Child) watch(alarm *boottime.Alarm) {
	defer close(c.watcherDone)
	defer alarm.Close()
	exec := c.payload.ExecDeadline
	for {
		lease := c.Lease().Deadline
		now := boottime.Now()
		switch {
		case !exec.IsZero() && !now.Before(exec):
			c.endDeadline(ErrExecutionDeadline)
			return
		case !lease.IsZero() && !now.Before(lease):
			c.endDeadline(ErrLeaseExpired)
			return
		}
		next := exec
		if next.IsZero() || !lease.IsZero() && lease.Before(next) {
			next = lease
		}
		if !next.IsZero() {
			if err := alarm.Set(next); err != nil {
				// Without an alarm the child cannot fence itself: stop now.
				c.endDeadline(fmt.Errorf("%w: %w", ErrLeaseExpired, err))
				return
			}
		}
		select {
		case <-alarm.C():
		case <-c.leaseMoved:
		case <-c.closing:
			return
		}
	}
}

// setLease takes l if it is newer than the lease the child has.
func (c *Child) setLease(l Lease) {
	c.mu.Lock()
	newer := l.Sent > c.lease.Sent
	if newer {
		c.lease = l
	}
	c.mu.Unlock()
	if !newer {
		return // a re-sent or older frame
	}
	for _, ch := range []chan struct{}{c.leaseMoved, c.leaseNews} {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Lease is the newest lease the child knows: the payload's, or that of the
// latest DEADLINE frame.
func (c *Child) Lease() Lease {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lease
}

// LeaseChanged receives (at most one pending notice) when a DEADLINE frame
// moved the lease; read Lease for the new one. The turn forwards it to the
// sandbox supervisor (K5).
func (c *Child) LeaseChanged() <-chan struct{} { return c.leaseNews }

// Deadlines is done when the lease deadline passes (cause ErrLeaseExpired)
// or the execution deadline passes (cause ErrExecutionDeadline), measured
// on CLOCK_BOOTTIME across suspends. It is separate from Context: a turn that
// goes on past the user's cancel STOP to settle must still end at either
// deadline.
func (c *Child) Deadlines() context.Context { return c.deadlines }

// readLoop reads what the parent may send after the payload: STOP,
// DEADLINE, KEPT, or EOF. EOF after ACCEPT with a re-attach socket is no
// stop: the turn goes on, fenced by its own lease deadline, and waits for
// the next daemon (P5).
func (c *Child) readLoop(conn *net.UnixConn, buf []byte) {
	defer c.readers.Done()
	for {
		f, err := readFrame(conn, buf)
		switch {
		case err != nil && errors.Is(err, net.ErrClosed) && c.isClosing(): // our own Close
			c.cancel(context.Canceled)
			return
		case err != nil && c.orphan(conn):
			return
		case err == io.EOF:
			c.cancel(ErrParentGone)
			return
		case err != nil:
			c.cancel(fmt.Errorf("%w: descriptor unreadable: %w", ErrParentGone, err))
			return
		case f.Type == FrameStop:
			class, err := parseClass(FrameStop, f.Body)
			if err != nil {
				class = ClassProtocol
			}
			c.cancel(&StopError{Class: class})
		case f.Type == FrameDeadline:
			e, l, err := parseDeadline(f.Body)
			if err == nil && e != c.payload.Echo {
				err = errors.New("DEADLINE for another attempt")
			}
			if err != nil {
				// Nobody we can trust renews this lease: stop as if it ended.
				c.cancel(&StopError{Class: ClassProtocol})
				c.endDeadline(fmt.Errorf("%w: %w", ErrLeaseExpired, err))
				continue
			}
			c.setLease(l)
		case f.Type == FrameKept && c.markKept():
		default:
			c.cancel(fmt.Errorf("%w: unexpected %s frame from parent", ErrParentGone, f.Type))
			return
		}
	}
}

func (c *Child) isClosing() bool {
	select {
	case <-c.closing:
		return true
	default:
		return false
	}
}

// markKept takes a KEPT after RESULT; false for one out of order.
func (c *Child) markKept() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.phase != childResulted || c.pendingResult == nil {
		return false
	}
	c.pendingResult = nil
	close(c.kept)
	return true
}

// orphan takes the daemon's end of conn going away after ACCEPT: with a
// re-attach socket the child waits on it for the next daemon and reports
// true; without one, or before ACCEPT (nobody but this child knows the turn
// began: it must not begin), false.
func (c *Child) orphan(conn *net.UnixConn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lis == nil || c.phase < childAccepted || c.conn != conn || c.isClosing() {
		return false
	}
	c.orphanedAt = boottime.Now()
	conn.Close()
	c.readers.Add(1)
	go c.awaitReattach()
	return true
}

// reattachTimeout bounds the REATTACH a connecting daemon owes.
const reattachTimeout = 10 * time.Second

// awaitReattach accepts connections on the re-attach socket until one
// brings a valid REATTACH for this attempt, or the Child is closed.
func (c *Child) awaitReattach() {
	defer c.readers.Done()
	for {
		conn, err := c.lis.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			select { // EMFILE and its kind: try again shortly
			case <-c.closing:
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		if buf, ok := c.attach(conn); ok {
			c.readers.Add(1)
			go c.readLoop(conn, buf)
			return
		}
		conn.Close()
	}
}

// attach runs the child's side of the re-attach handshake on conn: a
// REATTACH for this attempt from a process of our own user, ATTACHED in
// answer, then the newest PROGRESS and the RESULT not yet kept. On success
// conn is the descriptor from now on.
func (c *Child) attach(conn *net.UnixConn) ([]byte, bool) {
	if uid, _, err := peerCred(conn); err != nil || uid != os.Getuid() {
		return nil, false
	}
	conn.SetReadDeadline(time.Now().Add(reattachTimeout))
	buf := newReadBuffer()
	f, err := readFrame(conn, buf)
	if err != nil || f.Type != FrameReattach {
		return nil, false
	}
	r, err := parseReattach(f.Body)
	if err != nil || r.Echo != c.payload.Echo {
		return nil, false
	}
	conn.SetReadDeadline(time.Time{})
	if !c.attachLocked(conn, r) {
		return nil, false
	}
	if r.Lease != (Lease{}) {
		c.setLease(r.Lease)
	}
	return buf, true
}

func (c *Child) attachLocked(conn *net.UnixConn, r reattach) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	body, err := encodeAttached(attached{Echo: c.payload.Echo, Version: Version, Orphaned: boottime.Now().Sub(c.orphanedAt)})
	if err != nil || writeFrame(conn, FrameAttached, body) != nil {
		return false
	}
	if r.Version != Version {
		// The daemon checks too and stops us; we wait for the next one.
		return false
	}
	if c.lastProgress != nil && c.phase != childResulted && writeFrame(conn, FrameProgress, c.lastProgress) != nil {
		return false
	}
	if c.pendingResult != nil && writeFrame(conn, FrameResult, c.pendingResult) != nil {
		return false
	}
	c.conn, c.orphanedAt = conn, 0
	return true
}

// Orphaned reports whether the child is waiting for a daemon to re-attach.
func (c *Child) Orphaned() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.orphanedAt != 0
}

// Payload is what the parent handed over. Its Data carries the worker
// token: never log it.
func (c *Child) Payload() Payload { return c.payload }

// Context is cancelled when the parent sends STOP (cause: a *StopError) or
// is gone (cause: ErrParentGone); context.Cause says which.
func (c *Child) Context() context.Context { return c.ctx }

// Accept tells the parent the turn is the child's. Send it before anything
// with a side effect: from here on the claim is never released (R33, R35).
func (c *Child) Accept() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.phase != childOpen {
		return fmt.Errorf("%w: ACCEPT after ACCEPT or DECLINE", ErrOutOfOrder)
	}
	body, err := appendEcho(nil, c.payload.Echo)
	if err != nil {
		return err
	}
	if c.orphanedAt != 0 {
		return ErrParentGone
	}
	if err := writeFrame(c.conn, FrameAccept, body); err != nil {
		return err
	}
	c.phase = childAccepted
	return nil
}

// Decline refuses the turn with a reason class ([a-z][a-z0-9_]*, for
// example "preflight_failed"); the parent may then release the claim. The
// child must have done nothing with a side effect. Close and exit after it.
func (c *Child) Decline(class string) error {
	if err := validClass(class); err != nil {
		return fmt.Errorf("handover: decline: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.phase != childOpen {
		return fmt.Errorf("%w: DECLINE after ACCEPT or DECLINE", ErrOutOfOrder)
	}
	if err := writeFrame(c.conn, FrameDecline, []byte(class)); err != nil {
		return err
	}
	c.phase = childDeclined
	return nil
}

// Progress sends one progress record (at most MaxProgressBytes) after
// ACCEPT. It blocks while the parent is behind. With a re-attach socket it
// keeps the newest record for the next daemon and, while the daemon is
// gone, does nothing else (no error).
func (c *Child) Progress(body []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.phase != childAccepted {
		return fmt.Errorf("%w: PROGRESS before ACCEPT or after RESULT", ErrOutOfOrder)
	}
	c.lastProgress = append([]byte(nil), body...)
	if c.orphanedAt != 0 {
		return nil
	}
	err := writeFrame(c.conn, FrameProgress, body)
	if err != nil && c.lis != nil {
		return nil // the daemon is gone: the record waits for the next one
	}
	return err
}

// Result sends the turn's result (at most MaxResultBytes), once, after
// ACCEPT. With a re-attach socket it returns once the daemon has kept it
// (KEPT): a daemon that dies first gets it again from the next one, until
// the lease deadline passes (ErrParentGone then). Close and exit after it.
func (c *Child) Result(body []byte) error {
	c.mu.Lock()
	if c.phase != childAccepted {
		c.mu.Unlock()
		return fmt.Errorf("%w: RESULT before ACCEPT or twice", ErrOutOfOrder)
	}
	var err error
	if c.orphanedAt == 0 {
		err = writeFrame(c.conn, FrameResult, body)
	}
	if err != nil && c.lis == nil {
		c.mu.Unlock()
		return err
	}
	c.phase = childResulted
	if c.lis == nil {
		c.mu.Unlock()
		return nil
	}
	c.pendingResult = append([]byte(nil), body...)
	c.mu.Unlock()
	return c.awaitKept()
}

// awaitKept waits for KEPT, no longer than the lease: past its deadline no
// daemon can take the result any more.
func (c *Child) awaitKept() error {
	for {
		dl := c.Lease().Deadline
		if dl == 0 {
			dl = boottime.Now().Add(reattachTimeout)
		}
		left := dl.Sub(boottime.Now())
		if left <= 0 {
			return fmt.Errorf("%w: RESULT not kept by the lease deadline", ErrParentGone)
		}
		timer := time.NewTimer(left)
		select {
		case <-c.kept:
			timer.Stop()
			return nil
		case <-c.closing:
			timer.Stop()
			return fmt.Errorf("%w: closed before the RESULT was kept", ErrParentGone)
		case <-timer.C: // the lease may have moved meanwhile: look again
			if c.Lease().Deadline == dl {
				return fmt.Errorf("%w: RESULT not kept by the lease deadline", ErrParentGone)
			}
		}
	}
}

// Close closes the descriptor and waits for the reading goroutine. Closing
// before ACCEPT is a decline.
func (c *Child) Close() error {
	var err error
	c.closeOnce.Do(func() {
		close(c.closing)
		c.mu.Lock()
		err = c.conn.Close()
		c.mu.Unlock()
		if c.lis != nil {
			c.lis.Close()
		}
		c.readers.Wait()
		<-c.watcherDone
		c.endDeadline(context.Canceled)
	})
	return err
}
