package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore"
	"github.com/runnerd/runnerd/internal/syncbuf"
	"github.com/runnerd/runnerd/runner"
)

// systemd, end to end through `runnerd run`: with NOTIFY_SOCKET pointing at
// a unixgram socket of the test and WATCHDOG_USEC set, the daemon sends
// READY=1 after its first acknowledged host heartbeat, WATCHDOG=1 at half
// the watchdog period, and STOPPING=1 when SIGTERM starts the handover; the
// handover of an idle host ends the process with status 0. The effective
// configuration is logged once, without the host token.
func TestSystemdNotifyReadyWatchdogStopping(t *testing.T) {
	st, err := sqlstore.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv := controlplane.New(controlplane.Config{Store: st, Logger: slog.New(slog.DiscardHandler), MinLeaseTTL: time.Second, ClaimWaitMax: time.Second})
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	token := controlplane.NewToken(controlplane.HostTokenPrefix)
	if _, err := st.CreateHost(context.Background(), "host-sd", controlplane.HashToken(token), store.Audit{Actor: "test"}, time.Now()); err != nil {
		t.Fatal(err)
	}

	dir, err := os.MkdirTemp("", "sd") // short: a socket path has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NOTIFY_SOCKET", sock)
	t.Setenv("WATCHDOG_USEC", "400000") // WATCHDOG=1 every 200 ms

	args := []string{
		"--control-plane", hs.URL, "--host-token-file", tokenFile, "--host-name", "host-sd",
		"--state-dir", filepath.Join(dir, "state"), "--lease-ttl=1.2s", "--renew-interval=300ms",
		"--renew-timeout=100ms", "--renew-retry=50ms", "--host-heartbeat-interval=200ms", "--claim-wait=300ms",
		"--watchdog-interval=1h", // WATCHDOG_USEC wins
		"--listen-metrics=127.0.0.1:0",
	}
	stderr := &syncbuf.Buffer{}
	exit := make(chan int, 1)
	go func() { exit <- runDaemon(args, os.Getenv, io.Discard, stderr) }()

	got := make(chan string, 64)
	go func() {
		defer close(got)
		buf := make([]byte, 512)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			got <- string(buf[:n])
		}
	}()
	exitC := (<-chan int)(exit) // nil once the exit was seen
	next := func(want string) {
		t.Helper()
		timeout := time.After(10 * time.Second)
		for {
			select {
			case s := <-got:
				if s == want {
					return
				}
			case code := <-exitC:
				if code != 0 {
					t.Fatalf("runnerd exited %d before %s:\n%s", code, want, stderr)
				}
				exitC = nil // an idle handover may end first; the datagram is still queued
			case <-timeout:
				t.Fatalf("no %s within 10s:\n%s", want, stderr)
			}
		}
	}
	next("READY=1")
	next("STATUS=running 0/2 turns")
	if srvs, err := st.ListServers(context.Background()); err != nil || len(srvs) != 1 || srvs[0].LastHeartbeat == nil {
		t.Fatalf("READY=1 before an acknowledged heartbeat: %+v %v", srvs, err)
	}
	next("WATCHDOG=1")
	next("WATCHDOG=1")
	checkMetrics(t, stderr.String())
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	next("STOPPING=1")
	if exitC != nil {
		select {
		case code := <-exitC:
			if code != 0 {
				t.Fatalf("exit %d:\n%s", code, stderr)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("runnerd did not exit after the handover:\n%s", stderr)
		}
	}
	logs := stderr.String()
	if strings.Count(logs, `"msg":"runnerd_started"`) != 1 || strings.Contains(logs, token) {
		t.Fatalf("want one runnerd_started record and no token:\n%s", logs)
	}
	if !strings.Contains(logs, `"watchdog_ms":200`) {
		t.Fatalf("watchdog period not taken from WATCHDOG_USEC:\n%s", logs)
	}
}

// checkMetrics fetches /metrics from the address the daemon logged.
func checkMetrics(t *testing.T, logs string) {
	t.Helper()
	const key = `"msg":"runnerd_metrics_listening","addr":"`
	i := strings.Index(logs, key)
	if i < 0 {
		t.Fatalf("no metrics address logged:\n%s", logs)
	}
	addr, _, _ := strings.Cut(logs[i+len(key):], `"`)
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, series := range []string{"runnerd_leases_held 0", "runnerd_claim_to_accept_seconds_count 0", "runnerd_claim_wait_seconds_count 0", "runnerd_queue_wait_seconds_count 0", "go_goroutines",
		"runnerd_slots 2", "runnerd_draining 0", `runnerd_claims_paused{reason="launch_failures"} 0`, `runnerd_build_info{goversion="go`} {
		if !strings.Contains(string(b), series) {
			t.Errorf("/metrics has no %q", series)
		}
	}
	// After READY=1 (an acknowledged heartbeat) the probes on the same
	// listener answer 200, naming every check.
	for path, checks := range map[string][]string{"/healthz": {"claim_loop", "host_heartbeat_loop"}, "/readyz": {"control_plane", "claiming"}} {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		var p runner.Probe
		err = json.NewDecoder(resp.Body).Decode(&p)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || !p.OK || len(p.Checks) != len(checks) {
			t.Fatalf("%s: %d %+v %v", path, resp.StatusCode, p, err)
		}
		for i, c := range checks {
			if p.Checks[i].Name != c || !p.Checks[i].OK {
				t.Errorf("%s check %d: %+v, want %s ok", path, i, p.Checks[i], c)
			}
		}
	}
}

// A refused host token is a failed run: one record, one line on stderr
// naming the token file (never the token), exit status 3 — not an idle
// daemon that a drain later ends with 0.
func TestHostTokenRefusedExitsFailed(t *testing.T) {
	st, err := sqlstore.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv := controlplane.New(controlplane.Config{Store: st, Logger: slog.New(slog.DiscardHandler), MinLeaseTTL: time.Second, ClaimWaitMax: time.Second})
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	const token = "rdh_never-registered-0123456789"
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stderr := &syncbuf.Buffer{}
	exit := make(chan int, 1)
	go func() {
		exit <- runDaemon([]string{"--control-plane", hs.URL, "--host-token-file", tokenFile, "--host-name", "host-x",
			"--state-dir", filepath.Join(dir, "state"), "--lease-ttl=1.2s", "--renew-interval=300ms", "--renew-timeout=100ms",
			"--renew-retry=50ms", "--host-heartbeat-interval=200ms", "--claim-wait=300ms"}, os.Getenv, io.Discard, stderr)
	}()
	select {
	case code := <-exit:
		if code != exitHostTokenRefused {
			t.Fatalf("exit %d, want %d:\n%s", code, exitHostTokenRefused, stderr)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("runnerd stayed up with a refused host token:\n%s", stderr)
	}
	out := stderr.String()
	if strings.Count(out, `"msg":"runnerd_host_token_refused"`) != 1 || strings.Contains(out, token) ||
		!strings.Contains(out, "runnerd: the control plane refused the host token in "+tokenFile) {
		t.Fatalf("want one refusal record and one line naming the file, no token:\n%s", out)
	}
}

// The unit as shipped keeps systemd from restarting a daemon whose exit
// says a restart cannot help — bad configuration (2) and a refused host
// token (exitHostTokenRefused) — and the operations guide says what the
// unit does.
func TestUnitPreventsRestartOnDefinitiveExits(t *testing.T) {
	unit, err := os.ReadFile("../../deploy/runnerd.service")
	if err != nil {
		t.Fatal(err)
	}
	var prevent []string
	for _, line := range strings.Split(string(unit), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "RestartPreventExitStatus="); ok {
			prevent = append(prevent, strings.Fields(v)...)
		}
	}
	for _, code := range []int{2, exitHostTokenRefused} {
		if !slices.Contains(prevent, strconv.Itoa(code)) {
			t.Errorf("deploy/runnerd.service: RestartPreventExitStatus %v does not hold %d", prevent, code)
		}
	}
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := "`RestartPreventExitStatus=" + strings.Join(prevent, " ") + "`"; !strings.Contains(string(doc), want) {
		t.Errorf("docs/operations.md does not name the unit's %s", want)
	}
}
