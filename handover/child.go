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

	mu                           sync.Mutex // state and writes
	accepted, declined, resulted bool

	closeOnce  sync.Once
	readerDone chan struct{}
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
	f := os.NewFile(uintptr(fd), "handover")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("handover: descriptor %d: %w", fd, err)
	}
	conn := c.(*net.UnixConn)
	buf := newReadBuffer()
	fr, err := readFrame(conn, buf)
	if err == io.EOF {
		conn.Close()
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
		return nil, fmt.Errorf("handover: read payload: %w", err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	ch := &Child{conn: conn, payload: p, ctx: ctx, cancel: cancel, readerDone: make(chan struct{})}
	go ch.readLoop(buf)
	return ch, nil
}

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
		err = c.conn.Close()
		<-c.readerDone
	})
	return err
}
