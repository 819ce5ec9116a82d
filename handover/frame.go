package handover

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/runnerd/runnerd/internal/boottime"
)

// Version is the frame format version. A frame of any other version is
// rejected: parent and child are the same executable, so a mismatch means
// something other than our child is on the descriptor. Version 2 added the
// lease and execution deadlines to PAYLOAD and the DEADLINE frame; version
// 3 the re-attachment of a child to a new daemon (REATTACH, ATTACHED) and
// KEPT. A daemon re-attaches only to a child whose ATTACHED names a version
// it speaks (reattachVersions).
const Version = 3

// FrameType names one message of the handover protocol.
//
//	frame     sender  when                                      body
//	PAYLOAD   parent  once, right after the child started        echo + lease + execution deadline + opaque turn data
//	ACCEPT    child   once, before any side effect               echo of the payload's attempt id and generation
//	DECLINE   child   instead of ACCEPT, then it closes and exits reason class
//	PROGRESS  child   any number, only after ACCEPT, before RESULT opaque
//	RESULT    child   at most once, after ACCEPT                 opaque
//	STOP      parent  at most once, at any time after PAYLOAD    reason class
//	DEADLINE  parent  any number, at any time after PAYLOAD      echo + lease
//	KEPT      parent  once, after RESULT, once the daemon has it  empty
//	REATTACH  parent  first frame of a re-attach connection      echo + version + lease
//	ATTACHED  child   answer to REATTACH                         echo + version + orphaned ns
//
// The child keeps its RESULT until KEPT says the daemon has it on disk: a
// daemon that dies in between gets it again from the child when the next
// one re-attaches (P5). Re-attachment: a child that has accepted and sees
// EOF on its descriptor keeps its turn going, fenced by its own lease
// deadline (K5), and waits on its re-attach socket (Config.Reattach) for
// the next daemon, which sends REATTACH; the child answers ATTACHED and
// sends its newest PROGRESS and, if it has one, its RESULT again. From then
// on the new connection is the descriptor.
//
// A lease is two CLOCK_BOOTTIME instants (package boottime): the send time
// of the renewal the daemon last saw acknowledged (the claim's, in PAYLOAD)
// and the deadline it gives. The daemon sends a DEADLINE after every
// acknowledged renewal (K5). Each frame is whole by itself — it names the
// attempt and carries absolute instants, not a delay — so it may be sent
// again, by this daemon or by a new one re-attaching to the child: the child
// keeps the lease with the latest send time and ignores the others. A
// DEADLINE for another attempt is a protocol error.
//
// Anything else — an unknown type, a frame from the wrong side, a second
// ACCEPT, PROGRESS before ACCEPT, a frame after RESULT — is a protocol error.
// The descriptor closing before ACCEPT is a decline (R33); after ACCEPT it is
// the end of the turn, with or without a RESULT.
type FrameType uint8

const (
	FramePayload  FrameType = 1
	FrameAccept   FrameType = 2
	FrameDecline  FrameType = 3
	FrameProgress FrameType = 4
	FrameResult   FrameType = 5
	FrameStop     FrameType = 6
	FrameDeadline FrameType = 7
	FrameKept     FrameType = 8
	FrameReattach FrameType = 9
	FrameAttached FrameType = 10
)

func (t FrameType) String() string {
	switch t {
	case FramePayload:
		return "PAYLOAD"
	case FrameAccept:
		return "ACCEPT"
	case FrameDecline:
		return "DECLINE"
	case FrameProgress:
		return "PROGRESS"
	case FrameResult:
		return "RESULT"
	case FrameStop:
		return "STOP"
	case FrameDeadline:
		return "DEADLINE"
	case FrameKept:
		return "KEPT"
	case FrameReattach:
		return "REATTACH"
	case FrameAttached:
		return "ATTACHED"
	}
	return fmt.Sprintf("FRAME(0x%02x)", uint8(t))
}

// Size limits of frame bodies. They bound what a reader allocates: a length
// prefix over the limit is rejected before any body is allocated.
const (
	MaxPayloadBytes  = 4 << 20   // the claim-derived turn payload
	MaxProgressBytes = 256 << 10 // one progress record
	MaxResultBytes   = 1 << 20   // the turn's result
	maxControlBytes  = 512       // ACCEPT, DECLINE, STOP, DEADLINE
)

// Wire layout. One frame is one header followed by its body:
//
//	byte 0     version (1)
//	byte 1     frame type
//	bytes 2-3  reserved, zero
//	bytes 4-7  body length, big-endian uint32
//
// SOCK_SEQPACKET keeps message boundaries but a message must fit the socket
// buffer, so a frame travels as one message holding the header and up to
// maxMessage-headerLen body bytes, followed by as many continuation messages
// (raw body bytes, at most maxMessage each) as its length needs.
const (
	headerLen  = 8
	maxMessage = 32 << 10
)

// ErrMalformed marks every frame that breaks the format. Errors that wrap it
// say what was wrong; a reader stops at the first one.
var ErrMalformed = errors.New("handover: malformed frame")

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)
}

// bodyLimit is the largest body a frame type may carry; ok is false for an
// unknown type.
func bodyLimit(t FrameType) (limit int, ok bool) {
	switch t {
	case FramePayload:
		return MaxPayloadBytes, true
	case FrameProgress:
		return MaxProgressBytes, true
	case FrameResult:
		return MaxResultBytes, true
	case FrameAccept, FrameDecline, FrameStop, FrameDeadline, FrameKept, FrameReattach, FrameAttached:
		return maxControlBytes, true
	}
	return 0, false
}

// Frame is one decoded frame.
type Frame struct {
	Type FrameType
	Body []byte
}

// newReadBuffer returns a buffer for readFrame: one byte longer than the
// largest message, so that an oversized (and by read(2) silently truncated)
// message shows up as a full buffer.
func newReadBuffer() []byte { return make([]byte, maxMessage+1) }

// readFrame reads one frame from r, which returns one message per Read (a
// SOCK_SEQPACKET connection). It returns io.EOF only when the peer closed
// between frames; a frame cut short is malformed.
func readFrame(r io.Reader, buf []byte) (Frame, error) {
	n, err := r.Read(buf)
	if err != nil {
		return Frame{}, err
	}
	if n > maxMessage {
		return Frame{}, malformed("message longer than %d bytes", maxMessage)
	}
	if n < headerLen {
		return Frame{}, malformed("message of %d bytes is shorter than the %d-byte header", n, headerLen)
	}
	if buf[0] != Version {
		return Frame{}, malformed("version %d, want %d", buf[0], Version)
	}
	t := FrameType(buf[1])
	limit, ok := bodyLimit(t)
	if !ok {
		return Frame{}, malformed("unknown frame type 0x%02x", buf[1])
	}
	if buf[2] != 0 || buf[3] != 0 {
		return Frame{}, malformed("%s frame has non-zero reserved bytes", t)
	}
	size := binary.BigEndian.Uint32(buf[4:headerLen])
	if uint64(size) > uint64(limit) {
		return Frame{}, malformed("%s frame declares %d body bytes, limit %d", t, size, limit)
	}
	first := buf[headerLen:n]
	if len(first) > int(size) {
		return Frame{}, malformed("%s frame has %d bytes after its %d-byte body", t, len(first)-int(size), size)
	}
	body := make([]byte, size)
	filled := copy(body, first)
	for filled < len(body) {
		n, err := r.Read(buf)
		if err == io.EOF {
			return Frame{}, fmt.Errorf("%w: %s frame cut off after %d of %d body bytes: %w",
				ErrMalformed, t, filled, size, io.ErrUnexpectedEOF)
		}
		if err != nil {
			return Frame{}, err
		}
		if n > maxMessage {
			return Frame{}, malformed("message longer than %d bytes", maxMessage)
		}
		if n == 0 {
			return Frame{}, malformed("empty continuation message in %s frame", t)
		}
		if filled+n > len(body) {
			return Frame{}, malformed("%s frame continues %d bytes past its %d-byte body", t, filled+n-len(body), size)
		}
		filled += copy(body[filled:], buf[:n])
	}
	return Frame{Type: t, Body: body}, nil
}

// writeFrame writes one frame to w, which sends one message per Write. The
// caller serialises writers: a long frame spans several messages.
func writeFrame(w io.Writer, t FrameType, body []byte) error {
	limit, ok := bodyLimit(t)
	if !ok {
		return fmt.Errorf("handover: write frame: unknown frame type 0x%02x", uint8(t))
	}
	if len(body) > limit {
		return fmt.Errorf("handover: write %s frame: body of %d bytes over the limit of %d", t, len(body), limit)
	}
	first := min(len(body), maxMessage-headerLen)
	msg := make([]byte, headerLen+first)
	msg[0] = Version
	msg[1] = byte(t)
	binary.BigEndian.PutUint32(msg[4:headerLen], uint32(len(body)))
	copy(msg[headerLen:], body[:first])
	if _, err := w.Write(msg); err != nil {
		return fmt.Errorf("handover: write %s frame: %w", t, err)
	}
	for rest := body[first:]; len(rest) > 0; {
		n := min(len(rest), maxMessage)
		if _, err := w.Write(rest[:n]); err != nil {
			return fmt.Errorf("handover: write %s frame: %w", t, err)
		}
		rest = rest[n:]
	}
	return nil
}

// ---- bodies ----

// Echo identifies the turn a payload carries. The child's ACCEPT repeats it
// and the parent compares, so an ACCEPT can only ever confirm this payload.
type Echo struct {
	AttemptID       string
	LeaseGeneration int64
}

// Layout: generation (int64, big-endian), id length (1 byte), id.
const maxAttemptID = 200

func validAttemptID(id string) error {
	if id == "" || len(id) > maxAttemptID {
		return fmt.Errorf("attempt id of %d bytes, want 1 to %d", len(id), maxAttemptID)
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return fmt.Errorf("attempt id has a byte 0x%02x outside printable ASCII", id[i])
		}
	}
	return nil
}

func appendEcho(b []byte, e Echo) ([]byte, error) {
	if err := validAttemptID(e.AttemptID); err != nil {
		return nil, fmt.Errorf("handover: %w", err)
	}
	b = binary.BigEndian.AppendUint64(b, uint64(e.LeaseGeneration))
	b = append(b, byte(len(e.AttemptID)))
	return append(b, e.AttemptID...), nil
}

// parseEcho splits an echo off the front of b.
func parseEcho(t FrameType, b []byte) (Echo, []byte, error) {
	if len(b) < 9 {
		return Echo{}, nil, malformed("%s body of %d bytes is too short for an echo", t, len(b))
	}
	gen := int64(binary.BigEndian.Uint64(b))
	n := int(b[8])
	if len(b) < 9+n {
		return Echo{}, nil, malformed("%s echo declares a %d-byte attempt id, %d bytes left", t, n, len(b)-9)
	}
	id := string(b[9 : 9+n])
	if err := validAttemptID(id); err != nil {
		return Echo{}, nil, malformed("%s echo: %v", t, err)
	}
	return Echo{AttemptID: id, LeaseGeneration: gen}, b[9+n:], nil
}

func parseAccept(b []byte) (Echo, error) {
	e, rest, err := parseEcho(FrameAccept, b)
	if err != nil {
		return Echo{}, err
	}
	if len(rest) != 0 {
		return Echo{}, malformed("ACCEPT has %d bytes after its echo", len(rest))
	}
	return e, nil
}

// Lease is the daemon's local view of the lease (R10): Sent, when the last
// acknowledged renewal (at first, the claim) was sent, and Deadline, when
// the lease can no longer be valid. Both are CLOCK_BOOTTIME instants, the
// same moment in every process of the host. The zero Lease means none.
type Lease struct {
	Sent     boottime.Instant
	Deadline boottime.Instant
}

// Layout of a lease: sent, deadline (int64 nanoseconds, big-endian).
const leaseLen = 16

func appendLease(b []byte, l Lease) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(l.Sent))
	return binary.BigEndian.AppendUint64(b, uint64(l.Deadline))
}

// parseLease reads a lease: both zero (none), or 0 < Sent < Deadline.
func parseLease(t FrameType, b []byte) (Lease, error) {
	l := Lease{Sent: boottime.Instant(binary.BigEndian.Uint64(b)), Deadline: boottime.Instant(binary.BigEndian.Uint64(b[8:]))}
	if l != (Lease{}) && (l.Sent <= 0 || l.Deadline <= l.Sent) {
		return Lease{}, malformed("%s lease sent at %d with deadline %d", t, l.Sent, l.Deadline)
	}
	return l, nil
}

// Payload is what the parent hands the child: the echo the child must
// return in ACCEPT, the lease as it stood at launch, the execution deadline
// and the turn data, opaque to this package. Data carries the worker token:
// it travels only over the descriptor, never in argv or the environment, and
// nothing here logs it.
type Payload struct {
	Echo
	// Lease is the lease at launch; the child stops the turn by itself when
	// its deadline passes (K5). Zero means the child has no lease deadline.
	Lease Lease
	// ExecDeadline is when the execution timeout (R5) strikes, on
	// CLOCK_BOOTTIME; parent and child count the same deadline (K6). Zero
	// means none.
	ExecDeadline boottime.Instant
	Data         []byte
}

// Layout after the echo: lease (16 bytes), execution deadline (8 bytes), data.
func encodePayload(p Payload) ([]byte, error) {
	b, err := appendEcho(make([]byte, 0, 9+len(p.AttemptID)+leaseLen+8+len(p.Data)), p.Echo)
	if err != nil {
		return nil, err
	}
	if _, err := parseLease(FramePayload, appendLease(nil, p.Lease)); err != nil {
		return nil, fmt.Errorf("handover: payload: %w", err)
	}
	if p.ExecDeadline < 0 {
		return nil, fmt.Errorf("handover: payload: negative execution deadline")
	}
	b = appendLease(b, p.Lease)
	b = binary.BigEndian.AppendUint64(b, uint64(p.ExecDeadline))
	b = append(b, p.Data...)
	if len(b) > MaxPayloadBytes {
		return nil, fmt.Errorf("handover: payload of %d bytes over the limit of %d", len(b), MaxPayloadBytes)
	}
	return b, nil
}

func parsePayload(b []byte) (Payload, error) {
	e, rest, err := parseEcho(FramePayload, b)
	if err != nil {
		return Payload{}, err
	}
	if len(rest) < leaseLen+8 {
		return Payload{}, malformed("PAYLOAD has %d bytes after its echo, want at least %d", len(rest), leaseLen+8)
	}
	l, err := parseLease(FramePayload, rest)
	if err != nil {
		return Payload{}, err
	}
	exec := boottime.Instant(binary.BigEndian.Uint64(rest[leaseLen:]))
	if exec < 0 {
		return Payload{}, malformed("PAYLOAD execution deadline %d", exec)
	}
	return Payload{Echo: e, Lease: l, ExecDeadline: exec, Data: rest[leaseLen+8:]}, nil
}

// encodeDeadline is a DEADLINE body: echo, then the lease.
func encodeDeadline(e Echo, l Lease) ([]byte, error) {
	if l == (Lease{}) {
		return nil, errors.New("handover: DEADLINE without a lease")
	}
	if _, err := parseLease(FrameDeadline, appendLease(nil, l)); err != nil {
		return nil, err
	}
	b, err := appendEcho(nil, e)
	if err != nil {
		return nil, err
	}
	return appendLease(b, l), nil
}

func parseDeadline(b []byte) (Echo, Lease, error) {
	e, rest, err := parseEcho(FrameDeadline, b)
	if err != nil {
		return Echo{}, Lease{}, err
	}
	if len(rest) != leaseLen {
		return Echo{}, Lease{}, malformed("DEADLINE has %d bytes after its echo, want %d", len(rest), leaseLen)
	}
	l, err := parseLease(FrameDeadline, rest)
	if err != nil {
		return Echo{}, Lease{}, err
	}
	if l == (Lease{}) {
		return Echo{}, Lease{}, malformed("DEADLINE without a lease")
	}
	return e, l, nil
}

// Reason classes are short snake_case words, safe for records and for the
// release call's class field.
const maxClass = 64

func validClass(c string) error {
	if c == "" || len(c) > maxClass {
		return fmt.Errorf("class of %d bytes, want 1 to %d", len(c), maxClass)
	}
	for i := 0; i < len(c); i++ {
		ch := c[i]
		if !(ch >= 'a' && ch <= 'z' || i > 0 && (ch >= '0' && ch <= '9' || ch == '_')) {
			return fmt.Errorf("class has %q at %d; want [a-z][a-z0-9_]*", ch, i)
		}
	}
	return nil
}

func parseClass(t FrameType, b []byte) (string, error) {
	c := string(b)
	if err := validClass(c); err != nil {
		return "", malformed("%s: %v", t, err)
	}
	return c, nil
}

// parseBody checks a frame's body against its type; it is what the
// decoders above add to readFrame, gathered for the fuzz target.
func parseBody(f Frame) error {
	var err error
	switch f.Type {
	case FramePayload:
		_, err = parsePayload(f.Body)
	case FrameAccept:
		_, err = parseAccept(f.Body)
	case FrameDecline, FrameStop:
		_, err = parseClass(f.Type, f.Body)
	case FrameDeadline:
		_, _, err = parseDeadline(f.Body)
	case FrameKept:
		if len(f.Body) != 0 {
			err = malformed("KEPT with a body")
		}
	case FrameReattach:
		_, err = parseReattach(f.Body)
	case FrameAttached:
		_, err = parseAttached(f.Body)
	}
	return err
}

// reattach is a REATTACH body: the attempt the new daemon means, the
// protocol version it speaks and the lease it has just renewed.
type reattach struct {
	Echo
	Version uint8
	Lease   Lease
}

// Layout after the echo: version (1 byte), lease (16 bytes).
func encodeReattach(r reattach) ([]byte, error) {
	if _, err := parseLease(FrameReattach, appendLease(nil, r.Lease)); err != nil {
		return nil, err
	}
	b, err := appendEcho(nil, r.Echo)
	if err != nil {
		return nil, err
	}
	return appendLease(append(b, r.Version), r.Lease), nil
}

func parseReattach(b []byte) (reattach, error) {
	e, rest, err := parseEcho(FrameReattach, b)
	if err != nil {
		return reattach{}, err
	}
	if len(rest) != 1+leaseLen {
		return reattach{}, malformed("REATTACH has %d bytes after its echo, want %d", len(rest), 1+leaseLen)
	}
	l, err := parseLease(FrameReattach, rest[1:])
	if err != nil {
		return reattach{}, err
	}
	return reattach{Echo: e, Version: rest[0], Lease: l}, nil
}

// attached is an ATTACHED body: the attempt, the child's protocol version
// and how long it had been without a daemon.
type attached struct {
	Echo
	Version  uint8
	Orphaned time.Duration
}

// Layout after the echo: version (1 byte), orphaned nanoseconds (8 bytes).
func encodeAttached(a attached) ([]byte, error) {
	b, err := appendEcho(nil, a.Echo)
	if err != nil {
		return nil, err
	}
	return binary.BigEndian.AppendUint64(append(b, a.Version), uint64(max(a.Orphaned, 0))), nil
}

func parseAttached(b []byte) (attached, error) {
	e, rest, err := parseEcho(FrameAttached, b)
	if err != nil {
		return attached{}, err
	}
	if len(rest) != 9 {
		return attached{}, malformed("ATTACHED has %d bytes after its echo, want 9", len(rest))
	}
	d := int64(binary.BigEndian.Uint64(rest[1:]))
	if d < 0 {
		return attached{}, malformed("ATTACHED orphaned for %d ns", d)
	}
	return attached{Echo: e, Version: rest[0], Orphaned: time.Duration(d)}, nil
}
