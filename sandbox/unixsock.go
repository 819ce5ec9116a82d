package sandbox

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// maxSunPath is what fits in sockaddr_un.sun_path with its terminating NUL.
const maxSunPath = 107

// DialUnix connects to a unix socket. A path too long for a sockaddr (state
// directories under deep test or data paths) is reached through an O_PATH
// descriptor of its directory, /proc/self/fd/N/name.
func DialUnix(ctx context.Context, path string, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	if len(path) <= maxSunPath {
		return d.DialContext(ctx, "unix", path)
	}
	short, closeDir, err := shortPath(path)
	if err != nil {
		return nil, err
	}
	defer closeDir()
	return d.DialContext(ctx, "unix", short)
}

// ListenUnix listens on a unix socket at path, replacing a stale socket
// file, with mode 0600. Closing the listener removes the socket file.
func ListenUnix(path string) (net.Listener, error) {
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("listen %s: remove stale socket: %w", filepath.Base(path), err)
	}
	addr := path
	if len(path) > maxSunPath {
		short, closeDir, err := shortPath(path)
		if err != nil {
			return nil, err
		}
		defer closeDir()
		addr = short
	}
	l, err := net.Listen("unix", addr)
	if err != nil {
		return nil, err
	}
	// Only the owner may connect: the socket's permission is the credential.
	// (Keep the directory private too: this chmod comes after the bind.)
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("listen %s: chmod: %w", filepath.Base(path), err)
	}
	ul := l.(*net.UnixListener)
	ul.SetUnlinkOnClose(false)
	return &unlinkingListener{UnixListener: ul, path: path}, nil
}

type unlinkingListener struct {
	*net.UnixListener
	path string
}

func (l *unlinkingListener) Close() error {
	err := l.UnixListener.Close()
	_ = os.Remove(l.path)
	return err
}

func shortPath(path string) (string, func(), error) {
	fd, err := unix.Open(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, fmt.Errorf("open socket directory: %w", err)
	}
	short := fmt.Sprintf("/proc/self/fd/%d/%s", fd, filepath.Base(path))
	if len(short) > maxSunPath {
		unix.Close(fd)
		return "", nil, fmt.Errorf("socket name %q too long", filepath.Base(path))
	}
	return short, func() { unix.Close(fd) }, nil
}
