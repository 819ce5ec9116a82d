// Package pidfd waits for a process that is not our child to exit, on a
// pidfd rather than by polling. The process backend and the sandbox tests
// import it.
package pidfd

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// WaitExit returns once process pid has exited (a zombie counts as
// exited), or an error when timeout passes first.
func WaitExit(pid int, timeout time.Duration) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil // already gone and reaped
	}
	if err != nil {
		return fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	deadline := time.Now().Add(timeout)
	for {
		ms := int(time.Until(deadline).Milliseconds())
		if ms <= 0 {
			return fmt.Errorf("process %d still running after %v", pid, timeout)
		}
		n, err := unix.Poll(fds, ms)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("poll pidfd of %d: %w", pid, err)
		}
		if n > 0 {
			return nil
		}
	}
}
