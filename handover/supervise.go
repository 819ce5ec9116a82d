package handover

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"time"
)

// phase is where the parent's side of one child stands. The answer phases
// (launching, delivered, accepted) only move forward; stopping can begin in
// any of them, and ended comes last. Like runc's procReady/procRun, each
// names what the parent has seen, not what it hopes.
type phase int

const (
	phaseLaunching phase = iota // started; the payload is being written
	phaseDelivered              // the payload is written whole; no answer yet
	phaseAccepted               // ACCEPT with the right echo: the turn is the child's (R35)
	phaseStopping               // the stop sequence runs: STOP, StopGrace, SIGTERM, KillGrace, SIGKILL
	phaseEnded                  // the child is reaped and its descriptor drained: the outcome is decided
)

func (p phase) String() string {
	return [...]string{"launching", "delivered", "accepted", "stopping", "ended"}[p]
}

// stopWhy is why the stop sequence began. A forced stop (requested,
// timeout, protocol error) comes before the outcome is known and makes any
// later EOF or write failure no proof; a cleanup stop comes after it is
// decided and only makes sure nothing lingers.
type stopWhy int

const (
	stopCleanup stopWhy = iota
	stopRequested
	stopTimeout
	stopProtocol
)

// state is what the parent knows of one child, changed only by the event
// methods of supervisor; outcome reads it once the child has ended.
type state struct {
	phase  phase // the lifecycle: an answer phase, then stopping, then ended
	answer phase // the furthest answer phase reached (launching, delivered or accepted)

	forced              bool // a forced stop began: EOF and write failures prove nothing now
	requested, timedOut bool // which forced stops

	declineClass string // DECLINE's class
	protoErr     error  // the first protocol error, and its class
	protoClass   string
	result       []byte // RESULT's body, when haveResult
	haveResult   bool
	undelivered  bool  // the payload write failed before any forced stop
	eofBefore    bool  // the descriptor reached EOF before any forced stop
	cause        error // an I/O error that proves nothing

	readerDone, exited, peerClosed bool // the reader has its end; the child is reaped; the peer closed
}

func (s *state) stopping() bool { return s.phase >= phaseStopping }

// outcome is the child's end as the parent can prove it: an accepted turn's
// Ended, or the NotAccepted of one that never was.
func (s *state) outcome(ps *os.ProcessState) (Ended, *NotAccepted) {
	if s.answer == phaseAccepted {
		e := Ended{Stopped: s.requested, TimedOut: s.timedOut, Err: s.protoErr, ExitCode: -1}
		// A re-attached child is not ours to reap: no exit status (-1).
		ws, known := waitStatus(ps)
		switch {
		case s.haveResult:
			e.Outcome, e.Result = OutcomeResult, s.result
		case known && ws.Signaled():
			e.Outcome = OutcomeKilled
		default:
			e.Outcome = OutcomeExitedWithoutResult
		}
		if known && ws.Signaled() {
			e.Signal = ws.Signal()
		} else if known && ws.Exited() {
			e.ExitCode = ws.ExitStatus()
		}
		return e, nil
	}
	na := &NotAccepted{State: ps, Err: s.cause}
	switch {
	case s.protoErr != nil:
		na.Outcome, na.Class, na.Err = OutcomeUnconfirmed, s.protoClass, s.protoErr
	case s.declineClass != "":
		na.Outcome, na.Class = OutcomeDeclined, s.declineClass
	case s.undelivered:
		na.Outcome, na.Class = OutcomePayloadUndelivered, OutcomePayloadUndelivered.String()
	case s.eofBefore:
		na.Outcome, na.Class = OutcomeDeclined, ClassClosed
	case s.timedOut:
		na.Outcome, na.Class = OutcomeUnconfirmed, ClassExecutionTimeout
	case s.requested:
		na.Outcome, na.Class = OutcomeUnconfirmed, ClassStopped
	default: // the descriptor failed in a way that proves nothing
		na.Outcome, na.Class = OutcomeUnconfirmed, ClassDescriptor
	}
	return Ended{}, na
}

func (t *Turn) write(ft FrameType, body []byte, deadline time.Time) error {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	if !deadline.IsZero() {
		t.conn.SetWriteDeadline(deadline)
	}
	return writeFrame(t.conn, ft, body)
}

// supervisor runs one child's supervision: its state and the side effects
// of each event (frames written, timers, the answer). It lives on the
// supervising goroutine alone.
type supervisor struct {
	t       *Turn
	st      state
	writers sync.WaitGroup
	grace   *time.Timer
	graceC  <-chan time.Time
	lease   Lease // the newest from Config.Leases, sent once delivered
}

// supervise owns the child from its start (Launch) or its re-attachment
// (Reattach, payload nil) to its end: it writes the payload, reads every
// frame, enforces the protocol and the execution timeout, runs the stop
// sequence and decides the outcome.
func (t *Turn) supervise(ctx context.Context, payload []byte) {
	defer close(t.done)
	s := &supervisor{t: t}
	var (
		frames    = make(chan readResult)
		delivered = make(chan error, 1)
		exited    = t.exited
		ctxDone   = ctx.Done()
		stopReq   = (<-chan struct{})(t.stopReq)
		leases    = t.cfg.Leases
		timeout   = time.NewTimer(t.cfg.ExecutionTimeout)
	)
	defer timeout.Stop()
	go t.watch(frames)
	if payload == nil {
		// Re-attached: the child accepted under an earlier daemon.
		s.st.phase, s.st.answer, delivered = phaseAccepted, phaseAccepted, nil
	} else {
		s.writers.Go(func() { delivered <- t.write(FramePayload, payload, time.Time{}) })
	}

	// Until the reader has its end, the child is reaped and the payload
	// write has its answer: each of them can decide the outcome.
	for !s.st.readerDone || !s.st.exited || delivered != nil {
		if s.st.readerDone && s.st.exited && !s.st.peerClosed {
			// The end never closed: a payload write could block for ever.
			t.conn.SetWriteDeadline(time.Now())
		}
		select {
		case r := <-frames:
			if r.err != nil {
				s.readEnded(r.err)
			} else {
				s.frame(r.f)
			}
		case err := <-delivered:
			delivered = nil
			s.payloadWritten(err)
		case <-exited:
			exited = nil
			s.childExited()
		case l := <-leases:
			s.newLease(l)
		case <-timeout.C:
			s.beginStop(stopTimeout, ClassExecutionTimeout)
		case <-ctxDone:
			ctxDone = nil
			s.beginStop(stopRequested, stopClassOf(ctx))
		case <-stopReq:
			stopReq = nil
			s.beginStop(stopRequested, t.stopClass)
		case <-s.graceC:
			s.graceC = nil
			t.kill()
		}
	}
	s.end()
}

// beginStop starts the stop sequence once; a forced stop also marks every
// later EOF or write failure as no proof.
func (s *supervisor) beginStop(why stopWhy, class string) {
	t := s.t
	switch why {
	case stopRequested:
		s.st.requested = true
	case stopTimeout:
		s.st.timedOut = true
	}
	if why != stopCleanup && !s.st.forced {
		s.st.forced = true
		if s.st.answer == phaseLaunching {
			t.conn.SetWriteDeadline(time.Now()) // abandon the payload write
		}
	}
	if s.st.stopping() {
		return
	}
	s.st.phase = phaseStopping
	if s.st.answer >= phaseDelivered && !s.st.readerDone {
		s.writers.Go(func() { _ = t.write(FrameStop, []byte(class), time.Now().Add(t.cfg.StopGrace)) })
	}
	s.grace = time.NewTimer(t.cfg.StopGrace)
	s.graceC = s.grace.C
}

// protocol records the first protocol error and stops the child.
func (s *supervisor) protocol(class string, err error) {
	if s.st.protoErr == nil {
		s.st.protoErr, s.st.protoClass = err, class
	}
	s.beginStop(stopProtocol, ClassProtocol)
}

// sendLease writes a DEADLINE frame; a child that does not read it within
// StopGrace is frozen or gone, and its own deadline fences it.
func (s *supervisor) sendLease(l Lease) {
	t := s.t
	body, err := encodeDeadline(t.echo, l)
	if err != nil || s.st.answer == phaseLaunching || s.st.readerDone {
		return
	}
	s.writers.Go(func() { _ = t.write(FrameDeadline, body, time.Now().Add(t.cfg.StopGrace)) })
}

// newLease: a renewal was acknowledged (K5).
func (s *supervisor) newLease(l Lease) {
	s.lease = l
	s.sendLease(l)
}

// payloadWritten: the PAYLOAD write returned.
func (s *supervisor) payloadWritten(err error) {
	switch {
	case err == nil:
		if s.st.answer == phaseLaunching {
			s.st.answer = phaseDelivered
		}
		if s.st.phase == phaseLaunching {
			s.st.phase = phaseDelivered
		}
		if s.lease != (Lease{}) {
			s.sendLease(s.lease)
		}
	case !s.st.forced && !errors.Is(err, os.ErrDeadlineExceeded):
		// The write failed (EPIPE: the child's end is closed): the child
		// never had the whole payload, so it cannot have accepted it. A
		// deadline is ours and proves nothing.
		s.st.undelivered, s.st.cause = true, err
		s.beginStop(stopCleanup, ClassStopped)
	}
}

// readEnded: the reader stopped with err.
func (s *supervisor) readEnded(err error) {
	s.st.readerDone = true
	switch {
	// A peer that closes with our frames unread resets the connection
	// (Linux unix sockets): that is a close too.
	case err == io.EOF, errors.Is(err, syscall.ECONNRESET):
		s.st.peerClosed = true
		if !s.st.forced {
			s.st.eofBefore = true
		}
	case s.st.exited && errors.Is(err, os.ErrDeadlineExceeded):
		// Something outside the child's process group holds its end: the
		// descriptor never closed, so this proves nothing.
		s.st.cause = errors.New("handover: descriptor still open after the child exited")
	case errors.Is(err, ErrMalformed):
		s.protocol(ClassProtocol, fmt.Errorf("handover: read from child: %w", err))
	default:
		s.st.cause = err
	}
	if !s.st.exited {
		s.beginStop(stopCleanup, ClassStopped)
	}
}

// frame: one frame from the child.
func (s *supervisor) frame(f Frame) {
	t, st := s.t, &s.st
	accepted := st.answer == phaseAccepted
	switch {
	case !accepted && st.declineClass == "" && f.Type == FrameAccept:
		e, err := parseAccept(f.Body)
		switch {
		case err != nil:
			s.protocol(ClassProtocol, err)
		case e != t.echo:
			s.protocol(ClassBadEcho, fmt.Errorf("handover: ACCEPT echoes generation %d of another attempt, want generation %d",
				e.LeaseGeneration, t.echo.LeaseGeneration))
		case st.protoErr == nil:
			st.answer = phaseAccepted
			if !st.stopping() {
				st.phase = phaseAccepted
			}
			close(t.answered)
		}
	case !accepted && st.declineClass == "" && f.Type == FrameDecline:
		c, err := parseClass(FrameDecline, f.Body)
		if err != nil {
			s.protocol(ClassProtocol, err)
		} else {
			st.declineClass = c
			s.beginStop(stopCleanup, ClassStopped)
		}
	case accepted && !st.haveResult && f.Type == FrameProgress:
		if t.cfg.OnProgress != nil {
			t.cfg.OnProgress(f.Body)
		}
	case accepted && !st.haveResult && f.Type == FrameResult:
		st.result, st.haveResult = f.Body, true
		if t.cfg.OnResult != nil {
			t.cfg.OnResult(st.result)
		}
		if t.keep && !st.readerDone {
			s.writers.Go(func() { _ = t.write(FrameKept, nil, time.Now().Add(t.cfg.StopGrace)) })
		}
	default:
		s.protocol(ClassProtocol, fmt.Errorf("handover: unexpected %s frame from child (accepted=%t, declined=%t, result=%t)",
			f.Type, accepted, st.declineClass != "", st.haveResult))
	}
}

// childExited: the child is reaped. Frames it wrote before it died are
// queued; read them, but do not wait for EOF forever should a stray hold
// the end.
func (s *supervisor) childExited() {
	s.st.exited = true
	s.t.conn.SetReadDeadline(time.Now().Add(s.t.cfg.KillGrace))
}

// end closes the child's descriptor and publishes the outcome.
func (s *supervisor) end() {
	t := s.t
	if s.grace != nil {
		s.grace.Stop()
	}
	t.conn.SetWriteDeadline(time.Now())
	s.writers.Wait()
	t.conn.Close()
	if t.cfg.Reattach != "" {
		_ = os.Remove(t.cfg.Reattach) // the child is gone: nobody listens there
	}
	s.st.phase = phaseEnded
	e, na := s.st.outcome(t.state)
	if na == nil {
		t.ended = e
		return
	}
	t.notAccepted = na
	close(t.answered)
}
