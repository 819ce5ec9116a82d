package main

import (
	"bytes"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runnerd/runnerd/heartbeat"
	"github.com/runnerd/runnerd/internal/syncbuf"
	"github.com/runnerd/runnerd/runner"
	"github.com/runnerd/runnerd/wire"
)

// env sets the variables for the test (ff reads RUNNERD_ variables from
// the process environment) and returns the getenv runnerd is given.
func env(t *testing.T, kv ...string) func(string) string {
	for i := 0; i+1 < len(kv); i += 2 {
		t.Setenv(kv[i], kv[i+1])
	}
	return os.Getenv
}

// Flag > environment > default, for every kind of flag.
func TestConfigPrecedence(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		env   []string
		check func(t *testing.T, o options)
	}{
		{"defaults", nil, nil, func(t *testing.T, o options) {
			c := o.cfg
			if c.Capacity != runner.DefaultCapacity || c.Sandbox != "process" || c.ExecTimeout != 3600*time.Second ||
				c.Timings != (heartbeat.Timings{LeaseTTL: 120 * time.Second, Interval: 30 * time.Second, RequestTimeout: 10 * time.Second, RetryDelay: 5 * time.Second}) ||
				c.DrainTimeout != runner.DefaultDrainTimeout || c.StateDir != "/var/lib/runnerd" || o.logFormat != "json" ||
				o.tokenFile != "/etc/runnerd/host-token" || c.ControlPlaneURL != "http://127.0.0.1:8080" || o.metricsListen != "" ||
				c.Docker.Network != "none" || c.Docker.NanoCPUs != 1e9 || c.Docker.PidsLimit != 256 || c.LaunchFailures != 3 ||
				c.SandboxSweep != time.Minute || c.SandboxIdle != 30*time.Minute || c.Docker.LogMaxBytes != 10<<20 || c.Docker.LogMaxFiles != 3 || c.NoSpare {
				t.Fatalf("defaults %+v", o)
			}
		}},
		{"environment over default", nil, []string{"RUNNERD_CAPACITY", "5", "RUNNERD_SANDBOX", "docker", "RUNNERD_RENEW_INTERVAL", "20s",
			"RUNNERD_LOG_FORMAT", "text", "RUNNERD_DOCKER_CPUS", "0.5", "RUNNERD_METRICS_LISTEN", ":9464", "RUNNERD_HOST_NAME", "h1"},
			func(t *testing.T, o options) {
				if o.cfg.Capacity != 5 || o.cfg.Sandbox != "docker" || o.cfg.Timings.Interval != 20*time.Second ||
					o.logFormat != "text" || o.cfg.Docker.NanoCPUs != 5e8 || o.metricsListen != ":9464" || o.cfg.HostName != "h1" {
					t.Fatalf("%+v", o)
				}
			}},
		{"--listen-metrics, the issue's name, from the environment", nil, []string{"RUNNERD_LISTEN_METRICS", "127.0.0.1:9464"},
			func(t *testing.T, o options) {
				if o.metricsListen != "127.0.0.1:9464" {
					t.Fatalf("metrics address %q", o.metricsListen)
				}
			}},
		{"--listen-metrics and its older name agreeing", []string{"--listen-metrics=:9", "--metrics-listen=:9"}, nil,
			func(t *testing.T, o options) {
				if o.metricsListen != ":9" {
					t.Fatalf("metrics address %q", o.metricsListen)
				}
			}},
		{"container log caps from the environment", nil, []string{"RUNNERD_DOCKER_LOG_MAX_SIZE", "1048576", "RUNNERD_DOCKER_LOG_MAX_FILES", "5"},
			func(t *testing.T, o options) {
				if o.cfg.Docker.LogMaxBytes != 1<<20 || o.cfg.Docker.LogMaxFiles != 5 {
					t.Fatalf("log caps %d x %d", o.cfg.Docker.LogMaxBytes, o.cfg.Docker.LogMaxFiles)
				}
			}},
		{"flag over environment", []string{"--capacity=7", "--sandbox", "process", "--renew-interval=25s", "--host-name", "h2"},
			[]string{"RUNNERD_CAPACITY", "5", "RUNNERD_SANDBOX", "docker", "RUNNERD_RENEW_INTERVAL", "20s", "RUNNERD_HOST_NAME", "h1"},
			func(t *testing.T, o options) {
				if o.cfg.Capacity != 7 || o.cfg.Sandbox != "process" || o.cfg.Timings.Interval != 25*time.Second || o.cfg.HostName != "h2" {
					t.Fatalf("%+v", o)
				}
			}},
		{"scaled timings for tests", []string{"--lease-ttl=1.2s", "--renew-interval=300ms", "--renew-timeout=100ms", "--renew-retry=50ms"}, nil,
			func(t *testing.T, o options) {
				want := heartbeat.Timings{LeaseTTL: 1200 * time.Millisecond, Interval: 300 * time.Millisecond, RequestTimeout: 100 * time.Millisecond, RetryDelay: 50 * time.Millisecond}
				if o.cfg.Timings != want {
					t.Fatalf("timings %+v", o.cfg.Timings)
				}
			}},
		{"--sandbox-sweep over RUNNERD_SANDBOX_SWEEP", []string{"--sandbox-sweep=15s"}, []string{"RUNNERD_SANDBOX_SWEEP", "2m"},
			func(t *testing.T, o options) {
				if o.cfg.SandboxSweep != 15*time.Second {
					t.Fatalf("sweep %v", o.cfg.SandboxSweep)
				}
			}},
		{"RUNNERD_SANDBOX_SWEEP=0 turns the sweep off", nil, []string{"RUNNERD_SANDBOX_SWEEP", "0"},
			func(t *testing.T, o options) {
				if o.cfg.SandboxSweep >= 0 {
					t.Fatalf("sweep %v, want negative (off)", o.cfg.SandboxSweep)
				}
			}},
		{"--sandbox-idle over RUNNERD_SANDBOX_IDLE", []string{"--sandbox-idle=2s"}, []string{"RUNNERD_SANDBOX_IDLE", "1h"},
			func(t *testing.T, o options) {
				if o.cfg.SandboxIdle != 2*time.Second {
					t.Fatalf("idle %v", o.cfg.SandboxIdle)
				}
			}},
		{"RUNNERD_SPARE_CHILD=false keeps no spare turn child", nil, []string{"RUNNERD_SPARE_CHILD", "false"},
			func(t *testing.T, o options) {
				if !o.cfg.NoSpare {
					t.Fatal("a spare is kept")
				}
			}},
		{"RUNNERD_SANDBOX_IDLE=0 never stops an idle sandbox", nil, []string{"RUNNERD_SANDBOX_IDLE", "0"},
			func(t *testing.T, o options) {
				if o.cfg.SandboxIdle >= 0 {
					t.Fatalf("idle %v, want negative (never)", o.cfg.SandboxIdle)
				}
			}},
		{"R12: a short AGENT_LEASE_TTL is ignored with a warning", nil, []string{"AGENT_LEASE_TTL", "20"},
			func(t *testing.T, o options) {
				if o.cfg.Timings.LeaseTTL != 120*time.Second || len(o.warnings) != 1 || o.warnings[0].Setting != "AGENT_LEASE_TTL" || o.warnings[0].Given != 20*time.Second {
					t.Fatalf("lease %v, warnings %+v", o.cfg.Timings.LeaseTTL, o.warnings)
				}
			}},
		{"AGENT_LEASE_TTL long enough is used", nil, []string{"AGENT_LEASE_TTL", "90"},
			func(t *testing.T, o options) {
				if o.cfg.Timings.LeaseTTL != 90*time.Second || len(o.warnings) != 0 {
					t.Fatalf("lease %v, warnings %+v", o.cfg.Timings.LeaseTTL, o.warnings)
				}
			}},
		{"--lease-ttl over AGENT_LEASE_TTL", []string{"--lease-ttl=60s"}, []string{"AGENT_LEASE_TTL", "90"},
			func(t *testing.T, o options) {
				if o.cfg.Timings.LeaseTTL != 60*time.Second {
					t.Fatalf("lease %v", o.cfg.Timings.LeaseTTL)
				}
			}},
		{"RUNNERD_LEASE_TTL over AGENT_LEASE_TTL", nil, []string{"RUNNERD_LEASE_TTL", "45s", "AGENT_LEASE_TTL", "90"},
			func(t *testing.T, o options) {
				if o.cfg.Timings.LeaseTTL != 45*time.Second {
					t.Fatalf("lease %v", o.cfg.Timings.LeaseTTL)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseRun(tt.args, env(t, tt.env...))
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, o)
		})
	}
}

// Bad configuration: one clear line naming the setting, exit status 2.
// R12: a --lease-ttl (or RUNNERD_LEASE_TTL) shorter than one interval plus
// one request timeout is refused at start-up.
func TestR12BadConfigurationExitsWithOneLine(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{"R12 short --lease-ttl", []string{"--lease-ttl=30s"}, nil, "--lease-ttl 30s is shorter than"},
		{"R12 short --lease-ttl for scaled timings", []string{"--lease-ttl=350ms", "--renew-interval=300ms", "--renew-timeout=100ms", "--renew-retry=50ms"}, nil, "--lease-ttl 350ms is shorter than"},
		{"R12 short RUNNERD_LEASE_TTL", nil, []string{"RUNNERD_LEASE_TTL", "39s"}, "--lease-ttl 39s is shorter than"},
		{"retry longer than interval", []string{"--renew-retry=40s"}, nil, "--renew-retry 40s is longer than --renew-interval 30s"},
		{"zero interval", []string{"--renew-interval=0s"}, nil, "--renew-interval 0s: must be positive"},
		{"bad env value", nil, []string{"RUNNERD_CAPACITY", "many"}, `RUNNERD_CAPACITY="many" is not a valid --capacity`},
		{"bad flag value", []string{"--drain-timeout=soon"}, nil, `invalid value "soon" for flag -drain-timeout`},
		{"unknown flag", []string{"--capacty=2"}, nil, "flag provided but not defined: -capacty"},
		{"capacity zero", []string{"--capacity=0"}, nil, "--capacity 0: must be at least 1"},
		{"zero container log size", []string{"--docker-log-max-size=0"}, nil, "--docker-log-max-size 0: want a size in bytes"},
		{"no container log files", nil, []string{"RUNNERD_DOCKER_LOG_MAX_FILES", "0"}, "--docker-log-max-files 0: must be at least 1"},
		{"negative sandbox sweep", []string{"--sandbox-sweep=-1s"}, nil, "--sandbox-sweep -1s: must not be negative"},
		{"negative sandbox idle", []string{"--sandbox-idle=-1m"}, nil, "--sandbox-idle -1m0s: must not be negative"},
		{"bad sandbox", nil, []string{"RUNNERD_SANDBOX", "vm"}, `--sandbox "vm": want process or docker`},
		{"bad log format", []string{"--log-format=xml"}, nil, `--log-format "xml": want json or text`},
		{"the metrics address twice, disagreeing", []string{"--listen-metrics=:9", "--metrics-listen=:10"}, nil, `--listen-metrics ":9" and its older name --metrics-listen ":10" disagree: give one`},
		{"automatic label by hand", []string{"--label=sandbox=docker"}, nil, "--label sandbox=docker: sandbox is set by the daemon itself"},
		{"label not key=value", []string{"--label=gpu"}, nil, `invalid value "gpu" for flag -label: "gpu" is not key=value`},
		{"label value with a space", nil, []string{"RUNNERD_LABEL", "zone=eu 1"}, `RUNNERD_LABEL="zone=eu 1" is not a valid --label`},
		{"label given twice", []string{"--label=zone=a", "--label=zone=b"}, nil, "label zone given twice (a and b)"},
		{"bad URL", []string{"--control-plane=cp:8080"}, nil, `--control-plane "cp:8080": want an http:// or https:// URL`},
		{"bad entry in a list", nil, []string{"RUNNERD_CONTROL_PLANE", "https://cp-1:8443,cp-2:8443"}, `--control-plane "cp-2:8443": want an http:// or https:// URL`},
		{"empty entry in a list", []string{"--control-plane=https://cp-1:8443,"}, nil, `--control-plane "": want an http:// or https:// URL`},
		{"address given twice", []string{"--control-plane=https://cp-1:8443,https://cp-1:8443/"}, nil, `--control-plane "https://cp-1:8443/" is given twice`},
		{"missing token file", []string{"--host-token-file=/nonexistent/token"}, nil, "--host-token-file /nonexistent/token: no such file or directory"},
		{"client cert without key", []string{"--tls-client-cert=/etc/runnerd/client.pem"}, nil, "--tls-client-cert /etc/runnerd/client.pem needs --tls-client-key"},
		{"client key without cert", nil, []string{"RUNNERD_TLS_CLIENT_KEY", "/etc/runnerd/client-key.pem"}, "--tls-client-key /etc/runnerd/client-key.pem needs --tls-client-cert"},
		{"unreadable CA file", []string{"--ca-file=/nonexistent/ca.pem"}, nil, "--ca-file /nonexistent/ca.pem: no such file or directory"},
		{"CA file without a certificate", []string{"--ca-file=" + notPEM(t)}, nil, ": no PEM certificate in the file"},
		{"unreadable client cert", []string{"--tls-client-cert=/nonexistent/c.pem", "--tls-client-key=/nonexistent/k.pem"}, nil, "--tls-client-cert /nonexistent/c.pem: no such file or directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := runDaemon(tt.args, env(t, tt.env...), &stdout, &stderr)
			out := stderr.String()
			if code != 2 {
				t.Fatalf("exit %d, want 2; stderr %q", code, out)
			}
			if strings.Count(out, "\n") != 1 || !strings.HasPrefix(out, "runnerd: ") || !strings.Contains(out, tt.want) {
				t.Fatalf("stderr %q, want one line containing %q", out, tt.want)
			}
		})
	}
}

// notPEM is a file that holds no certificate.
func notPEM(t *testing.T) string {
	p := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(p, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// The token file must hold one token; its content never reaches an error.
func TestHostTokenFile(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "tok")
	if err := os.WriteFile(f, []byte("rdh_secret one two\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := runDaemon([]string{"--host-token-file", f, "--state-dir", dir}, env(t), &stdout, &stderr)
	if code != 2 || strings.Contains(stderr.String(), "secret") || !strings.Contains(stderr.String(), "one token on one line") {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
}

func TestHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := runDaemon([]string{"--help"}, env(t), &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "-renew-interval duration") {
		t.Fatalf("exit %d, stdout %q", code, stdout.String())
	}
}

func TestVersion(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := runDaemon([]string{"--version"}, env(t, "RUNNERD_CAPACITY", "bad-but-ignored"), &stdout, &stderr); code != 0 || stdout.String() != "runnerd dev\n" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
}

// R12 at start-up, the environment side: a too-short AGENT_LEASE_TTL does
// not stop the daemon; it runs with the default lease and says so in an
// agent_config_ignored record (never the raw value's text).
func TestR12ShortAgentLeaseTTLIsIgnoredWithRecord(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte("rdh_test-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--control-plane", "http://127.0.0.1:1", "--host-token-file", tok, "--state-dir", filepath.Join(dir, "state"), "--host-name", "h"}
	stderr := &syncbuf.Buffer{}
	exit := make(chan int, 1)
	go func() { exit <- runDaemon(args, env(t, "AGENT_LEASE_TTL", "20"), io.Discard, stderr) }()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(stderr.String(), `"msg":"runnerd_started"`) { // logged after the signal handler is in place
		if time.Now().After(deadline) {
			t.Fatalf("no runnerd_started:\n%s", stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-exit:
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, stderr)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no exit after SIGTERM:\n%s", stderr)
	}
	logs := stderr.String()
	for _, want := range []string{
		`"msg":"agent_config_ignored","setting":"AGENT_LEASE_TTL","given_ms":20000,"used_ms":120000`,
		`"lease_ttl_ms":120000`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("records lack %s:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, "rdh_test-token") {
		t.Error("the host token reached a record")
	}
}

// A token file others can read is warned about, but not a systemd
// credential (LoadCredential=, 0440 in $CREDENTIALS_DIRECTORY): the
// hardened unit hands the token to the runnerd user that way.
func TestTokenFileModeWarning(t *testing.T) {
	loose := filepath.Join(t.TempDir(), "host-token")
	credDir := t.TempDir()
	cred := filepath.Join(credDir, "host-token")
	for _, f := range []string{loose, cred} {
		if err := os.WriteFile(f, []byte("rdh_secret\n"), 0o440); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name, path, credDir string
		warn                bool
	}{
		{"group-readable file", loose, "", true},
		{"group-readable file outside the credentials directory", loose, credDir, true},
		{"systemd credential", cred, credDir, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			tok, err := readToken(tt.path, tt.credDir, slog.New(slog.NewTextHandler(&buf, nil)))
			if err != nil || tok != "rdh_secret" {
				t.Fatalf("readToken = %q, %v", tok, err)
			}
			if warned := strings.Contains(buf.String(), runner.MsgTokenFileMode); warned != tt.warn {
				t.Fatalf("warned %v, want %v; records %q", warned, tt.warn, buf.String())
			}
			if strings.Contains(buf.String(), "rdh_secret") {
				t.Fatal("the token reached a record")
			}
		})
	}
}

// runnerd --help and --version exit 0 (the usage on stdout); an unknown
// role is the usage on stderr and 2.
func TestTopLevelHelpAndVersion(t *testing.T) {
	for _, tc := range []struct {
		arg, out string
		code     int
	}{
		{"--help", "usage: runnerd run", 0}, {"-h", "usage: runnerd run", 0}, {"help", "usage: runnerd run", 0},
		{"--version", "runnerd dev", 0}, {"version", "runnerd dev", 0}, {"frob", "", 2},
	} {
		var stdout, stderr bytes.Buffer
		if code := answer(tc.arg, &stdout, &stderr); code != tc.code || !strings.Contains(stdout.String(), tc.out) ||
			(tc.code != 0) != strings.Contains(stderr.String(), "usage:") {
			t.Errorf("runnerd %s: exit %d, stdout %q, stderr %q", tc.arg, code, stdout.String(), stderr.String())
		}
	}
}

// --config FILE is the third source, below flags and RUNNERD_ variables,
// with the flags' own names; a missing file names its path; a setting the
// daemon does not have is refused.
func TestConfigFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "runnerd.conf")
	if err := os.WriteFile(file, []byte("# runnerd settings\ncapacity 6\nsandbox docker\nrenew-interval 20s\nhost-name from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := parseRun([]string{"--config", file, "--renew-interval=25s"}, env(t, "RUNNERD_CAPACITY", "5"))
	if err != nil {
		t.Fatal(err)
	}
	if o.cfg.Capacity != 5 || o.cfg.Sandbox != "docker" || o.cfg.Timings.Interval != 25*time.Second || o.cfg.HostName != "from-file" {
		t.Fatalf("capacity %d (env over file), sandbox %q (file), interval %v (flag over file), host %q (file)",
			o.cfg.Capacity, o.cfg.Sandbox, o.cfg.Timings.Interval, o.cfg.HostName)
	}
	t.Setenv("RUNNERD_CAPACITY", "")
	t.Setenv("RUNNERD_CONFIG", file) // the file itself may come from the environment
	if o, err := parseRun(nil, os.Getenv); err != nil || o.cfg.Capacity != 6 {
		t.Fatalf("RUNNERD_CONFIG: capacity %d, %v", o.cfg.Capacity, err)
	}
	missing := filepath.Join(dir, "nope.conf")
	if _, err := parseRun([]string{"--config", missing}, os.Getenv); err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("missing config file: %v", err)
	}
	if err := os.WriteFile(file, []byte("capacty 6\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := parseRun([]string{"--config", file}, os.Getenv); err == nil || !strings.Contains(err.Error(), `"capacty" not defined`) {
		t.Fatalf("unknown setting in the config file: %v", err)
	}
}

// --label from all three sources: repeated and comma-separated on the
// command line, in RUNNERD_LABEL, and one per line in --config. The
// daemon adds sandbox, os and arch to what its heartbeat sends.
func TestLabels(t *testing.T) {
	o, err := parseRun([]string{"--label", "gpu=a100", "--label=zone=eu-1,rack=r7"}, env(t))
	if err != nil {
		t.Fatal(err)
	}
	if want := (wire.Labels{"gpu": "a100", "zone": "eu-1", "rack": "r7"}); !reflect.DeepEqual(o.cfg.Labels, want) {
		t.Fatalf("labels from flags = %v, want %v", o.cfg.Labels, want)
	}
	file := filepath.Join(t.TempDir(), "runnerd.conf")
	if err := os.WriteFile(file, []byte("label gpu=a10\nlabel zone=ap-3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if o, err := parseRun([]string{"--config", file}, env(t)); err != nil || o.cfg.Labels.String() != "gpu=a10,zone=ap-3" {
		t.Fatalf("labels from --config = %v, %v", o.cfg.Labels, err)
	}
	if o, err := parseRun(nil, env(t, "RUNNERD_LABEL", "gpu=h100,zone=us-2")); err != nil || o.cfg.Labels.String() != "gpu=h100,zone=us-2" {
		t.Fatalf("labels from RUNNERD_LABEL = %v, %v", o.cfg.Labels, err)
	}
}
