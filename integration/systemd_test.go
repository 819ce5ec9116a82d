package integration

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// TestSystemdNotify runs the daemon as systemd would with Type=notify and
// WatchdogSec: NOTIFY_SOCKET names a unixgram socket the test reads and
// WATCHDOG_USEC asks for a 400 ms watchdog. READY=1 arrives after the
// first host heartbeat, WATCHDOG=1 keeps arriving, STOPPING=1 arrives on
// SIGTERM. The turn child and the supervisor inherit none of systemd's
// notify or watchdog variables.
func TestSystemdNotify(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	sockPath := filepath.Join(e.dir, "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sockPath, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	msgs := make(chan string, 1024)
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		buf := make([]byte, 4096)
		for {
			n, _, err := conn.ReadFromUnix(buf)
			if err != nil {
				close(msgs)
				return
			}
			for _, line := range strings.Split(strings.TrimSpace(string(buf[:n])), "\n") {
				select {
				case msgs <- line:
				default: // a full buffer only drops watchdog pets
				}
			}
		}
	}()
	t.Cleanup(func() { conn.Close(); <-readDone })

	startAt := time.Now()
	d := e.startDaemon(func(c *fleet.DaemonConfig) {
		c.Env = append(c.Env, "NOTIFY_SOCKET="+sockPath, "WATCHDOG_USEC=400000")
	})
	await := func(want string) time.Time {
		t.Helper()
		deadline := time.NewTimer(waitFor)
		defer deadline.Stop()
		for {
			select {
			case m, ok := <-msgs:
				if !ok {
					t.Fatalf("the notify socket closed before %s", want)
				}
				if m == want {
					return time.Now()
				}
			case <-deadline.C:
				t.Fatalf("no %s within %v", want, waitFor)
			case <-d.Done():
				t.Fatalf("runnerd exited (%v) before %s", d.Err(), want)
			}
		}
	}
	readyAt := await("READY=1")
	srv, ok, err := e.user.Server(e.ctx, e.host)
	if err != nil || !ok || srv.LastHeartbeat == nil || srv.LastHeartbeat.Before(startAt) {
		t.Errorf("READY=1 came before an acknowledged host heartbeat: %+v, %v", srv, err)
	}
	await("WATCHDOG=1")
	await("WATCHDOG=1")
	t.Logf("READY=1 %v after start", readyAt.Sub(startAt))

	c := e.conversation("notify")
	j := e.send(c.ID, fmt.Sprintf("look at my environment\n!silent %v", 3*renewEvery))
	e.waitPrompts(c.ID, 1)
	var checked int
	for _, p := range e.procs() {
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p.Pid))
		if err != nil || p.Pid == d.Pid() {
			continue
		}
		checked++
		for _, kv := range strings.Split(string(env), "\x00") {
			if strings.HasPrefix(kv, "NOTIFY_SOCKET=") || strings.HasPrefix(kv, "WATCHDOG_") {
				t.Errorf("%v inherited %s", p, kv)
			}
		}
	}
	if checked < 2 {
		t.Errorf("checked the environment of %d processes of the turn, want the turn child, the supervisor and the agent", checked)
	}
	if j := e.waitEnded(j.ID); j.State != wire.JobSucceeded {
		t.Errorf("turn: %s", describeJob(j))
	}

	d.Signal(syscall.SIGTERM)
	await("STOPPING=1")
	if err := d.Wait(waitFor); err != nil {
		t.Fatal(err)
	}
	if code := d.ExitCode(); code != 0 {
		t.Errorf("runnerd exited %d, want 0", code)
	}
}
