package runner

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/client"

	"github.com/runnerd/runnerd/sandbox/docker"
	"github.com/runnerd/runnerd/wire"
)

// dockerSocket is the real engine's socket, which the test forwards to.
const dockerSocket = "/var/run/docker.sock"

// forward serves path as a unix socket that copies every connection to
// the real Docker engine, until the test ends; then every connection is
// closed and its copies are waited for.
func forward(t *testing.T, path string) {
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex // guards conns
	var conns []net.Conn
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			e, err := net.Dial("unix", dockerSocket)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, e)
			mu.Unlock()
			// Either direction's end closes both, so the other ends too.
			wg.Go(func() { io.Copy(e, c); c.Close(); e.Close() })
			wg.Go(func() { io.Copy(c, e); c.Close(); e.Close() })
		}
	})
}

// §7 start-up honesty: a daemon whose Docker engine does not answer (its
// socket is missing) claims nothing and sends no READY=1, says why once
// (runnerd_claims_withheld) and in its host heartbeats (claims_withheld)
// and STATUS= line, and keeps probing; once the socket answers it says so
// once, sends READY=1 and runs the queued turn.
func TestUnreachableSandboxBackendWithholdsClaimsAndReady(t *testing.T) {
	if _, err := os.Stat(dockerSocket); err != nil {
		if os.Getenv("RUNNERD_REQUIRE_DOCKER") != "" {
			t.Fatalf("no Docker engine: %v", err)
		}
		t.Skip("no Docker engine")
	}
	dir, err := os.MkdirTemp("", "probe") // short: a socket path has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "docker.sock")
	engine, err := client.NewClientWithOpts(client.WithHost("unix://"+sock), client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	backend, err := docker.New(docker.Config{Engine: engine, Host: "probe-test", StateDir: t.TempDir(), RunnerdPath: exe})
	if err != nil {
		t.Fatal(err)
	}

	c := newCP(t)
	j := c.enqueue("result")
	n := &notes{}
	r := startDaemon(t, c, func(cfg *Config) {
		cfg.Backend = backend
		cfg.Sandbox = "docker"
		cfg.SandboxSweep = -1 // the sweep is not what this test is about
		cfg.Notifier = n
		cfg.ClaimBackoffMax = 200 * time.Millisecond
	})
	waitFor(t, "a heartbeat that withholds claims", 10*time.Second, func() bool {
		return c.server(t, "host-a").ClaimsWithheld == WithheldSandbox
	})
	waitFor(t, "a few more probes", 10*time.Second, func() bool { return n.count("STATUS=claims withheld: sandbox unavailable (0/1 turns)") == 1 })
	if got := c.job(j.ID); got.State != wire.JobQueued {
		t.Fatalf("job %s: claimed while the backend does not answer", got.State)
	}
	if n.count("READY=1") != 0 {
		t.Fatal("READY=1 while the backend does not answer")
	}
	if got := r.logs.count(MsgClaimsWithheld); got != 1 {
		t.Fatalf("%d %s records, want one", got, MsgClaimsWithheld)
	}
	if !strings.Contains(r.logs.String(), `"msg":"runnerd_claims_withheld","reason":"sandbox_unavailable","class":"engine_unreachable"`) {
		t.Fatalf("the withheld record does not name the class:\n%s", r.logs)
	}

	forward(t, sock)
	waitFor(t, "the turn to run", 20*time.Second, ended(c, j.ID))
	waitFor(t, "READY=1", 5*time.Second, func() bool { return n.count("READY=1") == 1 })
	if got := r.logs.count(MsgClaimsResumed); got != 1 {
		t.Fatalf("%d %s records, want one", got, MsgClaimsResumed)
	}
	waitFor(t, "a heartbeat that claims", 5*time.Second, func() bool { return c.server(t, "host-a").ClaimsWithheld == "" })
}

// A refused host token ends Run with ErrHostTokenRefused (cmd/runnerd
// exits non-zero on it) after one record, with nothing claimed.
func TestHostTokenRefusedEndsRunFailed(t *testing.T) {
	c := newCP(t)
	j := c.enqueue("result")
	n := &notes{}
	d, logs := newTestDaemon(t, c, func(cfg *Config) {
		cfg.HostToken = "rdh_not-a-real-token"
		cfg.Notifier = n
	})
	done := make(chan error, 1)
	go func() { done <- d.Run(context.Background()) }()
	select {
	case err := <-done:
		if !errors.Is(err, ErrHostTokenRefused) {
			t.Fatalf("Run = %v, want ErrHostTokenRefused", err)
		}
	case <-time.After(20 * time.Second):
		d.Drain()
		t.Fatal("the daemon stayed up with a refused host token")
	}
	if got := logs.count(MsgHostTokenRefused); got != 1 {
		t.Fatalf("%d refusal records", got)
	}
	if got := c.job(j.ID); got.State != wire.JobQueued {
		t.Fatalf("job %s: claimed with a refused token", got.State)
	}
	if n.count("READY=1") != 0 || n.count("STOPPING=1") != 1 {
		t.Fatalf("notifications %v", n.sends)
	}
	logs.noSecrets(t, "rdh_not-a-real-token")
}
