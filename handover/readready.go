package handover

import (
	"errors"
	"net"
	"sync"

	"golang.org/x/sys/unix"
)

// readBuffers lends readFrame its message-sized buffer (maxMessage+1
// bytes, 40 KB with the allocator's rounding) only while a message is
// there to read: a held turn's reader waits for one without a buffer, so
// 1,000 silent turns do not keep 40 MB of empty buffers.
var readBuffers = sync.Pool{New: func() any { b := newReadBuffer(); return &b }}

// readFrameWhenReady waits until conn has a message (or its end, an error
// or a deadline) on the runtime's poller, then reads one frame with a
// borrowed buffer. readFrame copies each body out, so the buffer goes back
// as soon as the frame is read.
func readFrameWhenReady(conn *net.UnixConn) (Frame, error) {
	waitReadable(conn)
	bp := readBuffers.Get().(*[]byte)
	defer readBuffers.Put(bp)
	return readFrame(conn, *bp)
}

// waitReadable returns once a read of conn would not block. Its own
// errors are not reported: the read that follows meets the same closed
// descriptor or passed deadline and returns it as readFrame always has.
func waitReadable(conn *net.UnixConn) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return
	}
	var peek [1]byte
	_ = rc.Read(func(fd uintptr) bool {
		// A peek takes nothing off the queue; EAGAIN hands the wait to the
		// poller, anything else (a message, EOF, an error) is readable.
		_, _, err := unix.Recvfrom(int(fd), peek[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		return !errors.Is(err, unix.EAGAIN)
	})
}
