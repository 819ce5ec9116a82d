package handover

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/runnerd/runnerd/internal/boottime"
)

// pair is a socket pair with the parent's end wrapped and the child's end
// as a raw descriptor, as the child finds it after exec.
func pair(t *testing.T) (parent *net.UnixConn, childFD int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fds[0]), "parent")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.UnixConn), fds[1]
}

func openChild(t *testing.T) (*net.UnixConn, *Child) {
	t.Helper()
	parent, fd := pair(t)
	body, err := encodePayload(testPayload())
	if err != nil {
		t.Fatal(err)
	}
	if err := writeFrame(parent, FramePayload, body); err != nil {
		t.Fatal(err)
	}
	ch, err := OpenFD(fd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Close() })
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil {
		// fd may have been reused by now only if something opened a file
		// in between; nothing does here.
		t.Errorf("descriptor %d still open after OpenFD; want it replaced by a duplicate", fd)
	}
	return parent, ch
}

func expectFrame(t *testing.T, parent *net.UnixConn, want FrameType) Frame {
	t.Helper()
	f, err := readFrame(parent, newReadBuffer())
	if err != nil || f.Type != want {
		t.Fatalf("parent read %s, %v; want %s", f.Type, err, want)
	}
	return f
}

// TestChildProtocolOrder: the child side sends frames only in the order
// the table in frame.go allows, and its ACCEPT echoes the payload.
func TestChildProtocolOrder(t *testing.T) {
	parent, ch := openChild(t)
	if p := ch.Payload(); p.Echo != testPayload().Echo || string(p.Data) != string(testPayload().Data) {
		t.Fatalf("payload %+v", p.Echo)
	}
	for name, send := range map[string]func() error{
		"PROGRESS": func() error { return ch.Progress([]byte("x")) },
		"RESULT":   func() error { return ch.Result([]byte("x")) },
	} {
		if err := send(); !errors.Is(err, ErrOutOfOrder) {
			t.Errorf("%s before ACCEPT: %v, want ErrOutOfOrder", name, err)
		}
	}
	if err := ch.Decline("Not A Class"); err == nil {
		t.Error("DECLINE with an invalid class sent")
	}
	if err := ch.Accept(); err != nil {
		t.Fatal(err)
	}
	e, err := parseAccept(expectFrame(t, parent, FrameAccept).Body)
	if err != nil || e != testPayload().Echo {
		t.Fatalf("ACCEPT echoes %+v, %v; want %+v", e, err, testPayload().Echo)
	}
	if err := ch.Accept(); !errors.Is(err, ErrOutOfOrder) {
		t.Errorf("second ACCEPT: %v", err)
	}
	if err := ch.Decline("preflight_failed"); !errors.Is(err, ErrOutOfOrder) {
		t.Errorf("DECLINE after ACCEPT: %v", err)
	}
	if err := ch.Progress([]byte("p")); err != nil {
		t.Fatal(err)
	}
	expectFrame(t, parent, FrameProgress)
	if err := ch.Result([]byte("r")); err != nil {
		t.Fatal(err)
	}
	expectFrame(t, parent, FrameResult)
	if err := ch.Result([]byte("r")); !errors.Is(err, ErrOutOfOrder) {
		t.Errorf("second RESULT: %v", err)
	}
	if err := ch.Progress([]byte("p")); !errors.Is(err, ErrOutOfOrder) {
		t.Errorf("PROGRESS after RESULT: %v", err)
	}
}

// TestChildContext: STOP cancels the child's context with the parent's
// class; EOF (the parent gone) cancels it with ErrParentGone.
func TestChildContext(t *testing.T) {
	t.Run("STOP", func(t *testing.T) {
		parent, ch := openChild(t)
		if err := writeFrame(parent, FrameStop, []byte("lease_lost")); err != nil {
			t.Fatal(err)
		}
		<-ch.Context().Done()
		var se *StopError
		if cause := context.Cause(ch.Context()); !errors.As(cause, &se) || se.Class != "lease_lost" || !errors.Is(cause, ErrStopRequested) {
			t.Fatalf("cause %v, want STOP lease_lost", cause)
		}
	})
	t.Run("parent gone", func(t *testing.T) {
		parent, ch := openChild(t)
		parent.Close()
		<-ch.Context().Done()
		if cause := context.Cause(ch.Context()); !errors.Is(cause, ErrParentGone) {
			t.Fatalf("cause %v, want ErrParentGone", cause)
		}
	})
	t.Run("parent gone before the payload", func(t *testing.T) {
		parent, fd := pair(t)
		parent.Close()
		if _, err := OpenFD(fd); !errors.Is(err, ErrParentGone) {
			t.Fatalf("OpenFD: %v, want ErrParentGone", err)
		}
	})
	t.Run("not a seqpacket socket", func(t *testing.T) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		defer w.Close()
		if _, err := OpenFD(int(r.Fd())); err == nil {
			t.Fatal("OpenFD took a pipe")
		}
	})
}

func openChildWith(t *testing.T, p Payload) (*net.UnixConn, *Child) {
	t.Helper()
	parent, fd := pair(t)
	body, err := encodePayload(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeFrame(parent, FramePayload, body); err != nil {
		t.Fatal(err)
	}
	ch, err := OpenFD(fd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Close() })
	return parent, ch
}

func sendDeadline(t *testing.T, parent *net.UnixConn, e Echo, l Lease) {
	t.Helper()
	body, err := encodeDeadline(e, l)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeFrame(parent, FrameDeadline, body); err != nil {
		t.Fatal(err)
	}
}

// waitDeadlines waits for the child's Deadlines and checks its cause and
// that it did not come before at (CLOCK_BOOTTIME).
func waitDeadlines(t *testing.T, ch *Child, want error, at boottime.Instant) {
	t.Helper()
	select {
	case <-ch.Deadlines().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Deadlines never ended")
	}
	now := boottime.Now()
	if cause := context.Cause(ch.Deadlines()); !errors.Is(cause, want) {
		t.Fatalf("cause %v, want %v", cause, want)
	}
	if now.Before(at) {
		t.Fatalf("Deadlines ended %v before its deadline", at.Sub(now))
	}
	if late := now.Sub(at); late > time.Second {
		t.Fatalf("Deadlines ended %v after its deadline", late)
	}
}

// TestChildLeaseDeadline (K5): the child's Deadlines ends when the lease
// deadline passes on CLOCK_BOOTTIME — the payload's, or the one of the
// DEADLINE frame with the latest send time; a re-sent or older frame
// changes nothing; a DEADLINE for another attempt ends the lease at once;
// the execution deadline ends it with its own cause (K6). STOP and the
// parent's death do not touch Deadlines.
func TestChildLeaseDeadline(t *testing.T) {
	echo := testPayload().Echo
	t.Run("the payload's deadline", func(t *testing.T) {
		now := boottime.Now()
		p := testPayload()
		p.Lease = Lease{Sent: now, Deadline: now.Add(150 * time.Millisecond)}
		_, ch := openChildWith(t, p)
		if ch.Lease() != p.Lease {
			t.Fatalf("lease %+v, want the payload's %+v", ch.Lease(), p.Lease)
		}
		waitDeadlines(t, ch, ErrLeaseExpired, p.Lease.Deadline)
		if ch.Context().Err() != nil {
			t.Fatal("the lease deadline cancelled Context too; it must stay the parent's")
		}
	})
	t.Run("moved by DEADLINE frames, latest send time wins", func(t *testing.T) {
		now := boottime.Now()
		p := testPayload()
		p.Lease = Lease{Sent: now, Deadline: now.Add(200 * time.Millisecond)}
		parent, ch := openChildWith(t, p)
		newer := Lease{Sent: now.Add(time.Millisecond), Deadline: now.Add(600 * time.Millisecond)}
		sendDeadline(t, parent, echo, newer)
		select {
		case <-ch.LeaseChanged():
		case <-time.After(5 * time.Second):
			t.Fatal("no LeaseChanged for a newer lease")
		}
		// The payload's own lease again, and the newer one re-sent: neither
		// moves anything (a re-attaching daemon may re-send).
		sendDeadline(t, parent, echo, p.Lease)
		sendDeadline(t, parent, echo, newer)
		if err := writeFrame(parent, FrameStop, []byte("cancelled")); err != nil {
			t.Fatal(err)
		}
		<-ch.Context().Done()
		waitDeadlines(t, ch, ErrLeaseExpired, newer.Deadline)
		if ch.Lease() != newer {
			t.Fatalf("lease %+v, want %+v", ch.Lease(), newer)
		}
		select {
		case <-ch.LeaseChanged():
			t.Fatal("LeaseChanged for a frame that moved nothing")
		default:
		}
	})
	t.Run("after the parent is gone", func(t *testing.T) {
		now := boottime.Now()
		p := testPayload()
		p.Lease = Lease{Sent: now, Deadline: now.Add(150 * time.Millisecond)}
		parent, ch := openChildWith(t, p)
		parent.Close()
		<-ch.Context().Done()
		waitDeadlines(t, ch, ErrLeaseExpired, p.Lease.Deadline)
	})
	t.Run("DEADLINE for another attempt", func(t *testing.T) {
		now := boottime.Now()
		p := testPayload()
		p.Lease = Lease{Sent: now, Deadline: now.Add(time.Hour)}
		parent, ch := openChildWith(t, p)
		other := echo
		other.LeaseGeneration++
		sendDeadline(t, parent, other, Lease{Sent: now.Add(time.Second), Deadline: now.Add(2 * time.Hour)})
		waitDeadlines(t, ch, ErrLeaseExpired, now)
		var se *StopError
		if cause := context.Cause(ch.Context()); !errors.As(cause, &se) || se.Class != ClassProtocol {
			t.Fatalf("context cause %v, want a protocol stop", cause)
		}
	})
	t.Run("lease deadline before the execution deadline", func(t *testing.T) {
		// The payload of every launched turn has both: the earlier one,
		// here the lease's, ends Deadlines.
		now := boottime.Now()
		p := testPayload()
		p.Lease = Lease{Sent: now, Deadline: now.Add(150 * time.Millisecond)}
		p.ExecDeadline = now.Add(time.Hour)
		_, ch := openChildWith(t, p)
		waitDeadlines(t, ch, ErrLeaseExpired, p.Lease.Deadline)
	})
	t.Run("execution deadline", func(t *testing.T) {
		now := boottime.Now()
		p := testPayload()
		p.Lease = Lease{Sent: now, Deadline: now.Add(time.Hour)}
		p.ExecDeadline = now.Add(150 * time.Millisecond)
		_, ch := openChildWith(t, p)
		waitDeadlines(t, ch, ErrExecutionDeadline, p.ExecDeadline)
	})
}
