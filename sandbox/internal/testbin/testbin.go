// Package testbin builds the binaries the sandbox tests run as real
// processes (the demo agent) and waits on real processes without sleeping.
// Only tests of the sandbox packages import it.
package testbin

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// BuildDemoAgent builds cmd/demoagent, static, into dir and returns its path.
// Call it from TestMain: the build cache makes repeated builds cheap.
func BuildDemoAgent(dir string) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out := filepath.Join(dir, "demoagent")
	cmd := exec.Command(goBin, "build", "-trimpath", "-o", out, "github.com/runnerd/runnerd/cmd/demoagent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build demoagent: %w\n%s", err, b)
	}
	return out, nil
}

// WaitGone waits, on a pidfd and not by polling, until process pid has
// exited (a zombie counts as exited), or the timeout passes.
func WaitGone(pid int, timeout time.Duration) error {
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
			return fmt.Errorf("process %d still alive after %v", pid, timeout)
		}
		n, err := unix.Poll(fds, ms)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
	}
}

// Alive reports whether pid names a process that has not exited. A zombie
// is not alive.
func Alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// State is the field after the parenthesised command name.
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == ')' && i+2 < len(b) {
			return b[i+2] != 'Z' && b[i+2] != 'X'
		}
	}
	return false
}
