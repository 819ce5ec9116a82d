package handover

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"
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
