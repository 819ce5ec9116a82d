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

// Child is the child's end of the handover: the payload it was given and
// the frames it may send. Its methods are safe for concurrent use.
type Child struct {
	conn    *net.UnixConn
	payload Payload

	ctx    context.Context
	cancel context.CancelCauseFunc

	// deadlines ends when the lease or the execution deadline passes.
	deadlines   context.Context
	endDeadline context.CancelCauseFunc
	leaseMoved  chan struct{} // one pending wake-up of the watcher
	leaseNews   chan struct{} // one pending notice for LeaseChanged

	mu                           sync.Mutex // guards the flags, lease and writes
	accepted, declined, resulted bool
	lease                        Lease // the one with the latest Sent

	closeOnce   sync.Once
	closing     chan struct{} // closed by Close: the watcher ends
	readerDone  chan struct{}
	watcherDone chan struct{}
}

// OpenFromEnv opens the descriptor named by EnvFD and unsets the variable,
// so that nothing the child starts sees it. Only the child's main calls it.
func OpenFromEnv() (*Child, error) {
	v, ok := os.LookupEnv(EnvFD)
	os.Unsetenv(EnvFD)
	if !ok {
		return nil, fmt.Errorf("handover: %s is not set: not started by the handover parent", EnvFD)
	}
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("handover: %s=%q is not a descriptor number above 2", EnvFD, v)
	}
	return OpenFD(fd)
}

// OpenFD takes over descriptor fd, which must be the child's end of a
// SOCK_SEQPACKET socket pair, and reads the PAYLOAD. fd itself is closed:
// the Child holds a close-on-exec duplicate, so no process the child starts
// inherits the descriptor and EOF stays a faithful sign for the parent.
// When the parent is already gone the error is ErrParentGone.
func OpenFD(fd int) (*Child, error) {
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
		closing: make(chan struct{}), readerDone: make(chan struct{}), watcherDone: make(chan struct{}),
	}
	go ch.readLoop(buf)
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

// readLoop waits for STOP or EOF, the only things the parent may send after
// the payload.
func (c *Child) readLoop(buf []byte) {
	defer close(c.readerDone)
	for {
		f, err := readFrame(c.conn, buf)
		switch {
		case err == io.EOF:
			c.cancel(ErrParentGone)
			return
		case err != nil:
			if errors.Is(err, net.ErrClosed) { // our own Close
				c.cancel(context.Canceled)
			} else {
				c.cancel(fmt.Errorf("%w: descriptor unreadable: %w", ErrParentGone, err))
			}
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
		default:
			c.cancel(fmt.Errorf("%w: unexpected %s frame from parent", ErrParentGone, f.Type))
			return
		}
	}
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
	if c.accepted || c.declined {
		return fmt.Errorf("%w: ACCEPT after ACCEPT or DECLINE", ErrOutOfOrder)
	}
	body, err := appendEcho(nil, c.payload.Echo)
	if err != nil {
		return err
	}
	if err := writeFrame(c.conn, FrameAccept, body); err != nil {
		return err
	}
	c.accepted = true
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
	if c.accepted || c.declined {
		return fmt.Errorf("%w: DECLINE after ACCEPT or DECLINE", ErrOutOfOrder)
	}
	if err := writeFrame(c.conn, FrameDecline, []byte(class)); err != nil {
		return err
	}
	c.declined = true
	return nil
}

// Progress sends one progress record (at most MaxProgressBytes) after
// ACCEPT. It blocks while the parent is behind.
func (c *Child) Progress(body []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.accepted || c.resulted {
		return fmt.Errorf("%w: PROGRESS before ACCEPT or after RESULT", ErrOutOfOrder)
	}
	return writeFrame(c.conn, FrameProgress, body)
}

// Result sends the turn's result (at most MaxResultBytes), once, after
// ACCEPT. Close and exit after it.
func (c *Child) Result(body []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.accepted || c.resulted {
		return fmt.Errorf("%w: RESULT before ACCEPT or twice", ErrOutOfOrder)
	}
	if err := writeFrame(c.conn, FrameResult, body); err != nil {
		return err
	}
	c.resulted = true
	return nil
}

// Close closes the descriptor and waits for the reading goroutine. Closing
// before ACCEPT is a decline.
func (c *Child) Close() error {
	var err error
	c.closeOnce.Do(func() {
		close(c.closing)
		err = c.conn.Close()
		<-c.readerDone
		<-c.watcherDone
		c.endDeadline(context.Canceled)
	})
	return err
}
