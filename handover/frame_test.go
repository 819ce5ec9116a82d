package handover

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// msgConn is an in-memory SOCK_SEQPACKET: one message per Read and Write,
// and a Read into a short buffer truncates the message, as read(2) does.
type msgConn struct{ msgs [][]byte }

func (c *msgConn) Read(p []byte) (int, error) {
	if len(c.msgs) == 0 {
		return 0, io.EOF
	}
	m := c.msgs[0]
	c.msgs = c.msgs[1:]
	return copy(p, m), nil
}

func (c *msgConn) Write(p []byte) (int, error) {
	c.msgs = append(c.msgs, slices.Clone(p))
	return len(p), nil
}

func header(t FrameType, size uint32) []byte {
	h := []byte{Version, byte(t), 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(h[4:], size)
	return h
}

func TestFrameRoundTrip(t *testing.T) {
	first := maxMessage - headerLen
	for _, tc := range []struct {
		name string
		typ  FrameType
		size int
		msgs int
	}{
		{"empty result", FrameResult, 0, 1},
		{"one byte", FrameProgress, 1, 1},
		{"fills one message", FrameProgress, first, 1},
		{"one byte more", FrameProgress, first + 1, 2},
		{"several messages", FramePayload, first + 2*maxMessage + 5, 4},
		{"largest payload", FramePayload, MaxPayloadBytes, (MaxPayloadBytes-first+maxMessage-1)/maxMessage + 1},
		{"largest result", FrameResult, MaxResultBytes, (MaxResultBytes-first+maxMessage-1)/maxMessage + 1},
		{"largest control", FrameStop, maxControlBytes, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := make([]byte, tc.size)
			for i := range body {
				body[i] = byte(i * 7)
			}
			var c msgConn
			if err := writeFrame(&c, tc.typ, body); err != nil {
				t.Fatal(err)
			}
			if len(c.msgs) != tc.msgs {
				t.Fatalf("%d messages, want %d", len(c.msgs), tc.msgs)
			}
			for _, m := range c.msgs {
				if len(m) > maxMessage {
					t.Fatalf("message of %d bytes over %d", len(m), maxMessage)
				}
			}
			f, err := readFrame(&c, newReadBuffer())
			if err != nil {
				t.Fatal(err)
			}
			if f.Type != tc.typ || !bytes.Equal(f.Body, body) {
				t.Fatalf("read %s of %d bytes, want %s of %d", f.Type, len(f.Body), tc.typ, len(body))
			}
			if _, err := readFrame(&c, newReadBuffer()); err != io.EOF {
				t.Fatalf("after the frame: %v, want io.EOF", err)
			}
		})
	}
}

func TestWriteFrameRefuses(t *testing.T) {
	var c msgConn
	if err := writeFrame(&c, FrameType(11), nil); err == nil {
		t.Error("unknown type written")
	}
	if err := writeFrame(&c, FrameProgress, make([]byte, MaxProgressBytes+1)); err == nil {
		t.Error("oversized PROGRESS written")
	}
	if len(c.msgs) != 0 {
		t.Errorf("%d messages sent for refused frames", len(c.msgs))
	}
}

// TestReadFrameMalformed: every way a frame can break gets ErrMalformed and
// a message that says what broke.
func TestReadFrameMalformed(t *testing.T) {
	ok := header(FrameResult, 3)
	for _, tc := range []struct {
		name string
		msgs [][]byte
		want string
	}{
		{"short header", [][]byte{{Version, byte(FrameResult), 0}}, "shorter than the 8-byte header"},
		{"version 0", [][]byte{append([]byte{0}, ok[1:]...)}, "version 0, want 3"},
		{"version 1, before the deadlines", [][]byte{append([]byte{1}, ok[1:]...)}, "version 1, want 3"},
		{"version 2, before re-attachment", [][]byte{append([]byte{2}, ok[1:]...)}, "version 2, want 3"},
		{"version 4", [][]byte{append([]byte{4}, ok[1:]...)}, "version 4, want 3"},
		{"type 0", [][]byte{header(0, 0)}, "unknown frame type 0x00"},
		{"type 11", [][]byte{header(11, 0)}, "unknown frame type 0x0b"},
		{"type 0xff", [][]byte{header(0xff, 0)}, "unknown frame type 0xff"},
		{"reserved byte", [][]byte{{Version, byte(FrameResult), 1, 0, 0, 0, 0, 0}}, "non-zero reserved"},
		{"payload over limit", [][]byte{header(FramePayload, MaxPayloadBytes+1)}, "PAYLOAD frame declares 4194305 body bytes, limit 4194304"},
		{"progress over limit", [][]byte{header(FrameProgress, MaxProgressBytes+1)}, "limit 262144"},
		{"result over limit", [][]byte{header(FrameResult, math.MaxUint32)}, "declares 4294967295 body bytes"},
		{"accept over limit", [][]byte{header(FrameAccept, maxControlBytes+1)}, "ACCEPT frame declares 513"},
		{"trailing bytes", [][]byte{append(header(FrameResult, 1), 'a', 'b')}, "1 bytes after its 1-byte body"},
		{"cut off", [][]byte{append(header(FrameResult, 3), 'a')}, "cut off after 1 of 3 body bytes"},
		{"continuation overruns", [][]byte{append(header(FrameResult, 3), 'a'), []byte("bcd")}, "continues 1 bytes past"},
		{"message too long", [][]byte{append(header(FrameResult, 0), make([]byte, maxMessage)...)}, "message longer than 32768"},
		{"continuation too long", [][]byte{append(header(FrameResult, MaxResultBytes), 'a'), make([]byte, maxMessage+1)}, "message longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := readFrame(&msgConn{msgs: tc.msgs}, newReadBuffer())
			if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want ErrMalformed saying %q", err, tc.want)
			}
		})
	}
	t.Run("cut off is also unexpected EOF", func(t *testing.T) {
		_, err := readFrame(&msgConn{msgs: [][]byte{append(header(FrameResult, 3), 'a')}}, newReadBuffer())
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("err %v, want io.ErrUnexpectedEOF too", err)
		}
	})
}

func TestParseBodiesMalformed(t *testing.T) {
	good, err := appendEcho(nil, Echo{AttemptID: "att-1", LeaseGeneration: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		f    Frame
		want string
	}{
		{"accept empty", Frame{FrameAccept, nil}, "too short for an echo"},
		{"accept id longer than body", Frame{FrameAccept, append(good[:8:8], 9, 'a')}, "declares a 9-byte attempt id, 1 bytes left"},
		{"accept empty id", Frame{FrameAccept, append(good[:8:8], 0)}, "attempt id of 0 bytes"},
		{"accept id with a space", Frame{FrameAccept, append(good[:8:8], 2, 'a', ' ')}, "outside printable ASCII"},
		{"accept trailing", Frame{FrameAccept, append(slices.Clone(good), 'x')}, "1 bytes after its echo"},
		{"payload empty", Frame{FramePayload, nil}, "PAYLOAD body of 0 bytes"},
		{"decline empty", Frame{FrameDecline, nil}, "class of 0 bytes"},
		{"decline upper case", Frame{FrameDecline, []byte("Preflight")}, "want [a-z][a-z0-9_]*"},
		{"decline leading digit", Frame{FrameDecline, []byte("1x")}, "want [a-z][a-z0-9_]*"},
		{"stop too long", Frame{FrameStop, bytes.Repeat([]byte("a"), maxClass+1)}, "class of 65 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := parseBody(tc.f)
			if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want ErrMalformed saying %q", err, tc.want)
			}
		})
	}
	lease := Lease{Sent: 5e9, Deadline: 125e9}
	body, err := encodePayload(Payload{Echo: Echo{AttemptID: "att-1", LeaseGeneration: 3}, Lease: lease, ExecDeadline: 3605e9, Data: []byte("data")})
	if err != nil {
		t.Fatal(err)
	}
	p, err := parsePayload(body)
	if err != nil || p.AttemptID != "att-1" || p.LeaseGeneration != 3 || p.Lease != lease || p.ExecDeadline != 3605e9 || string(p.Data) != "data" {
		t.Fatalf("payload %+v, %v", p, err)
	}
	dl, err := encodeDeadline(p.Echo, lease)
	if err != nil {
		t.Fatal(err)
	}
	if e, l, err := parseDeadline(dl); err != nil || e != p.Echo || l != lease {
		t.Fatalf("DEADLINE %+v %+v, %v", e, l, err)
	}
	backwards := appendLease(slices.Clone(good), Lease{Sent: 9e9, Deadline: 8e9})
	for _, tc := range []struct {
		name string
		f    Frame
		want string
	}{
		{"payload without deadlines", Frame{FramePayload, append(slices.Clone(good), "data"...)}, "want at least 24"},
		{"payload lease ends before it was sent", Frame{FramePayload, append(slices.Clone(backwards), make([]byte, 8)...)}, "lease sent at"},
		{"deadline empty lease", Frame{FrameDeadline, appendLease(slices.Clone(good), Lease{})}, "DEADLINE without a lease"},
		{"deadline lease ends before it was sent", Frame{FrameDeadline, backwards}, "lease sent at"},
		{"deadline short", Frame{FrameDeadline, append(slices.Clone(good), 1, 2, 3)}, "3 bytes after its echo, want 16"},
		{"deadline trailing", Frame{FrameDeadline, append(slices.Clone(dl), 0)}, "17 bytes after its echo, want 16"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := parseBody(tc.f)
			if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want ErrMalformed saying %q", err, tc.want)
			}
		})
	}
}

// TestReadFrameBoundedAllocation: a length prefix over the limit is refused
// before the body is allocated.
func TestReadFrameBoundedAllocation(t *testing.T) {
	buf := newReadBuffer()
	msg := header(FrameResult, math.MaxUint32)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	const runs = 100
	for range runs {
		if _, err := readFrame(&msgConn{msgs: [][]byte{msg}}, buf); !errors.Is(err, ErrMalformed) {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / runs; per > 1024 {
		t.Fatalf("%d bytes allocated per refused frame, want under 1 KiB", per)
	}
}

func TestFrameTypeString(t *testing.T) {
	want := []string{"FRAME(0x00)", "PAYLOAD", "ACCEPT", "DECLINE", "PROGRESS", "RESULT", "STOP", "DEADLINE", "KEPT", "REATTACH", "ATTACHED", "FRAME(0x0b)"}
	for i, w := range want {
		if got := FrameType(i).String(); got != w {
			t.Errorf("FrameType(%d) = %q, want %q", i, got, w)
		}
	}
}

// FuzzReadFrame feeds arbitrary bytes, cut into messages of a fuzzed size,
// to the decoder the descriptor uses. It must not panic; it must refuse
// with ErrMalformed (or io.EOF for no input at all); what it accepts must
// be within the type's limit and survive a round trip.
func FuzzReadFrame(f *testing.F) {
	var c msgConn
	_ = writeFrame(&c, FrameStop, []byte("lease_lost"))
	f.Add(c.msgs[0], uint16(maxMessage))
	f.Fuzz(func(t *testing.T, data []byte, chunk uint16) {
		size := max(int(chunk), 1)
		var in msgConn
		for rest := data; len(rest) > 0; {
			n := min(size, len(rest))
			in.msgs = append(in.msgs, rest[:n])
			rest = rest[n:]
		}
		fr, err := readFrame(&in, newReadBuffer())
		if err != nil {
			if err == io.EOF && len(data) == 0 {
				return
			}
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v is neither io.EOF on no input nor ErrMalformed", err)
			}
			return
		}
		limit, ok := bodyLimit(fr.Type)
		if !ok || len(fr.Body) > limit {
			t.Fatalf("accepted %s with %d body bytes", fr.Type, len(fr.Body))
		}
		if err := parseBody(fr); err != nil && !errors.Is(err, ErrMalformed) {
			t.Fatalf("body error %v is not ErrMalformed", err)
		}
		var out msgConn
		if err := writeFrame(&out, fr.Type, fr.Body); err != nil {
			t.Fatal(err)
		}
		again, err := readFrame(&out, newReadBuffer())
		if err != nil || again.Type != fr.Type || !bytes.Equal(again.Body, fr.Body) {
			t.Fatalf("round trip: %s %d bytes, %v; want %s %d bytes", again.Type, len(again.Body), err, fr.Type, len(fr.Body))
		}
	})
}
