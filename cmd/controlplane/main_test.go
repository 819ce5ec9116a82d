package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore"
	"github.com/runnerd/runnerd/internal/syncbuf"
	"github.com/runnerd/runnerd/wire"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func noEnv(string) string { return "" }

// envOf sets the variables for the test (ff reads flags' variables from
// the process environment) and returns the getenv the command is given.
func envOf(t *testing.T, m map[string]string) func(string) string {
	for k, v := range m {
		t.Setenv(k, v)
	}
	return os.Getenv
}

func runCmd(t *testing.T, env func(string) string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, env, &out, &errOut)
	return code, out.String(), errOut.String()
}

// Bad flags and arguments end with one clear line and exit 2.
func TestBadFlagsOneLine(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"no command", nil, nil, "usage: controlplane"},
		{"unknown command", nil, []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"unknown flag", nil, []string{"serve", "--bogus"}, "flag provided but not defined: -bogus"},
		{"short lease", nil, []string{"serve", "--lease-ttl", "39s"}, "--lease-ttl 39s must be between --min-lease-ttl 40s"},
		{"short lease from env", map[string]string{"CONTROLPLANE_LEASE_TTL": "10s"}, []string{"serve"}, "--lease-ttl 10s must be between --min-lease-ttl 40s"},
		{"the daemon's RUNNERD_LEASE_TTL is not read", map[string]string{"RUNNERD_LEASE_TTL": "10s"}, []string{"serve", "--max-worker-lost", "0"}, "--max-worker-lost must be at least 1"},
		{"lease under a lowered minimum", nil, []string{"serve", "--min-lease-ttl", "2s", "--lease-ttl", "1s"}, "--lease-ttl 1s must be between --min-lease-ttl 2s"},
		{"max under min", nil, []string{"serve", "--max-lease-ttl", "30s"}, "--max-lease-ttl 30s is shorter than --min-lease-ttl 40s"},
		{"bad env value", map[string]string{"CONTROLPLANE_REAPER_INTERVAL": "soon"}, []string{"serve"}, `CONTROLPLANE_REAPER_INTERVAL="soon" is not a valid --reaper-interval`},
		{"bad db", nil, []string{"serve", "--db", "mysql://x"}, "--db must be sqlite:PATH or postgres://"},
		{"negative retention", map[string]string{"CONTROLPLANE_RETENTION": "-1h"}, []string{"serve"}, "--retention must not be negative"},
		{"bad synchronous", nil, []string{"serve", "--sqlite-synchronous", "off"}, "--sqlite-synchronous must be normal or full"},
		{"bad log level", nil, []string{"serve", "--log-level", "loud"}, "--log-level must be"},
		{"zero worker lost", nil, []string{"serve", "--max-worker-lost", "0"}, "--max-worker-lost must be at least 1"},
		{"stray argument", nil, []string{"serve", "now"}, `unexpected argument "now"`},
		{"tls cert without key", nil, []string{"serve", "--tls-cert", "cert.pem"}, "--tls-cert cert.pem needs --tls-key"},
		{"tls key without cert", nil, []string{"serve", "--tls-key", "key.pem"}, "--tls-key key.pem needs --tls-cert"},
		{"client CA without a pair", nil, []string{"serve", "--client-ca", "ca.pem"}, "--client-ca needs --tls-cert and --tls-key"},
		{"unreadable tls cert", nil, []string{"serve", "--tls-cert", "/nonexistent/cert.pem", "--tls-key", "/nonexistent/key.pem"}, "--tls-cert /nonexistent/cert.pem: no such file or directory"},
		{"unreadable client CA", nil, []string{"serve", "--tls-cert", "c", "--tls-key", "k", "--client-ca", "/nonexistent/ca.pem"}, "--client-ca /nonexistent/ca.pem: no such file or directory"},
		{"host without a subcommand", nil, []string{"host", "frob", "x"}, `"host" takes a subcommand: add, list`},
		{"host pause without name", nil, []string{"host", "pause"}, "missing the host's NAME"},
		{"host add without name", nil, []string{"host", "add", "--data-dir", dir}, "missing the host's NAME"},
		{"host add bad name", nil, []string{"host", "add", "a b", "--data-dir", dir}, "may hold only letters"},
		{"submit without target", nil, []string{"submit", "--prompt", "x"}, "give either --conversation ID or --new"},
		{"submit new without agent", nil, []string{"submit", "--new", "--prompt", "x"}, "--new needs --agent"},
		{"submit without prompt", nil, []string{"submit", "--conversation", "c"}, "--prompt is required"},
		{"submit require not key=value", nil, []string{"submit", "--new", "--agent", "a", "--prompt", "x", "--require", "gpu"}, `--require "gpu": label "gpu" is not key=value`},
		{"submit require for an old conversation", nil, []string{"submit", "--conversation", "c", "--prompt", "x", "--sandbox", "docker"}, "--sandbox and --require are for --new conversations only"},
		{"submit bad server", nil, []string{"submit", "--conversation", "c", "--prompt", "x", "--server", "ftp://x"}, "--server must be an http://"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runCmd(t, envOf(t, tc.env), tc.args...)
			if code != exitUsage {
				t.Fatalf("exit %d, want %d; stderr %q", code, exitUsage, stderr)
			}
			if !strings.Contains(stderr, tc.want) {
				t.Fatalf("stderr %q lacks %q", stderr, tc.want)
			}
			if tc.args != nil && strings.Count(stderr, "\n") != 1 {
				t.Fatalf("stderr is not one line: %q", stderr)
			}
		})
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("refused commands created files: %v", entries)
	}
}

// A flag beats its environment variable, which beats the default.
func TestFlagEnvPrecedence(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"default", nil, nil, "127.0.0.1:8080"},
		{"env", map[string]string{"CONTROLPLANE_LISTEN": ":9000"}, nil, ":9000"},
		{"flag over env", map[string]string{"CONTROLPLANE_LISTEN": ":9000"}, []string{"--listen", ":9001"}, ":9001"},
		{"empty env is unset", map[string]string{"CONTROLPLANE_LISTEN": ""}, nil, "127.0.0.1:8080"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			envOf(t, tc.env)
			f := newFlags("serve", io.Discard)
			listen := f.fs.String("listen", "127.0.0.1:8080", "")
			if err := f.parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if *listen != tc.want {
				t.Fatalf("listen %q, want %q", *listen, tc.want)
			}
		})
	}
}

// createDB makes the SQLite database of data directory dir, as serve does
// on its first start.
func createDB(t *testing.T, dir string) {
	t.Helper()
	st, err := sqlstore.OpenSQLite(context.Background(), filepath.Join(dir, "controlplane.db"))
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
}

// The commands that need a database (host add, token create|list|revoke)
// refuse to run without one, exit 2 naming where they looked, and leave
// nothing behind: an empty database made by a typo in --data-dir would
// answer "no tokens" or register a host nobody serves.
func TestCommandsRefuseAMissingDatabase(t *testing.T) {
	for _, args := range [][]string{
		{"host", "add", "host-1"},
		{"token", "create", "ci"},
		{"token", "list"},
		{"token", "revoke", "ut_x"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			code, stdout, stderr := runCmd(t, noEnv, append(args, "--data-dir", dir)...)
			want := "no database at sqlite:" + filepath.Join(dir, "controlplane.db")
			if code != exitUsage || stdout != "" || !strings.Contains(stderr, want) {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit %d and %q", code, stdout, stderr, exitUsage, want)
			}
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the data directory was made: %v", err)
			}
		})
	}
}

// host add prints the token once and stores only its hash; --token-file
// writes it 0600 and never replaces a file; a second host of the same name
// is refused.
func TestHostAdd(t *testing.T) {
	dir := t.TempDir()
	createDB(t, dir)
	code, stdout, stderr := runCmd(t, noEnv, "host", "add", "host-1", "--data-dir", dir)
	if code != exitOK {
		t.Fatalf("host add: exit %d, %s", code, stderr)
	}
	token := strings.TrimSpace(stdout)
	if !strings.HasPrefix(token, controlplane.HostTokenPrefix) || strings.Contains(stderr, token) {
		t.Fatalf("stdout %q, stderr %q", stdout, stderr)
	}
	file := filepath.Join(dir, "h2.token")
	code, stdout, stderr = runCmd(t, envOf(t, map[string]string{"CONTROLPLANE_DATA_DIR": dir}), "host", "add", "--token-file", file, "host-2")
	if code != exitOK || stdout != "" {
		t.Fatalf("host add --token-file: exit %d, stdout %q, stderr %s", code, stdout, stderr)
	}
	fi, err := os.Stat(file)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v, mode %v", err, fi.Mode())
	}
	b, _ := os.ReadFile(file)
	token2 := strings.TrimSpace(string(b))

	code, _, stderr = runCmd(t, noEnv, "host", "add", "host-1", "--data-dir", dir)
	if code != exitFail || !strings.Contains(stderr, `a host named "host-1" already exists`) {
		t.Fatalf("duplicate host: exit %d, %q", code, stderr)
	}
	code, _, _ = runCmd(t, noEnv, "host", "add", "host-3", "--data-dir", dir, "--token-file", file)
	if code != exitFail {
		t.Fatalf("host add over an existing token file: exit %d", code)
	}
	if b2, _ := os.ReadFile(file); !bytes.Equal(b, b2) {
		t.Fatal("an existing token file was replaced")
	}

	st, err := sqlstore.OpenSQLite(context.Background(), filepath.Join(dir, "controlplane.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for name, tok := range map[string]string{"host-1": token, "host-2": token2} {
		h, err := st.HostByTokenHash(context.Background(), controlplane.HashToken(tok))
		if err != nil || h.Name != name {
			t.Fatalf("host by %s's token hash: %+v, %v", name, h, err)
		}
	}
	if hs, _ := st.ListServers(context.Background()); len(hs) != 2 {
		t.Fatalf("hosts %+v, want host-1 and host-2 (host-3 failed)", hs)
	}
	matches, _ := filepath.Glob(filepath.Join(dir, "controlplane.db*"))
	for _, m := range matches {
		raw, _ := os.ReadFile(m)
		if bytes.Contains(raw, []byte(token)) || bytes.Contains(raw, []byte(token2)) {
			t.Fatalf("%s holds a host token in clear", m)
		}
	}
}

// serve runs, submit drives two turns through it while the test plays the
// runner, and a cancelled context (the signal) stops serve cleanly.
func TestServeAndSubmit(t *testing.T) {
	dir := t.TempDir()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	pr, pw := io.Pipe()
	served := make(chan int, 1)
	go func() {
		served <- run(ctx, []string{"serve", "--listen", "127.0.0.1:0", "--data-dir", dir}, noEnv, io.Discard, pw)
		pw.Close()
	}()
	// The first line names the address; the rest is drained into logs.
	sc := bufio.NewScanner(pr)
	if !sc.Scan() {
		t.Fatalf("serve printed nothing: %v", sc.Err())
	}
	first := sc.Text()
	_, addr, ok := strings.Cut(first, "serving ")
	if !ok {
		t.Fatalf("first line %q does not name the address", first)
	}
	addr, _, _ = strings.Cut(addr, " ")
	logs := &syncbuf.Buffer{}
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for sc.Scan() {
			logs.Write([]byte(sc.Text() + "\n"))
		}
	}()

	fi, err := os.Stat(filepath.Join(dir, "user-token"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("user token file: %v, %v", err, fi)
	}
	code, stdout, stderr := runCmd(t, noEnv, "host", "add", "host-1", "--data-dir", dir)
	if code != exitOK {
		t.Fatalf("host add: %d %s", code, stderr)
	}
	hostToken := strings.TrimSpace(stdout)
	wc := &wire.Client{BaseURL: addr}

	// What serve puts in front of the server answers a raw ".." segment
	// as the server does, 400 invalid with the documented body — not a
	// redirect of its own (307, no JSON) — and still serves /metrics.
	for path, want := range map[string]int{"/v1/../v1/conversations": http.StatusBadRequest, "/metrics": http.StatusOK} {
		resp, err := http.Get(addr + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || want == http.StatusBadRequest && !strings.Contains(string(b), `"code":"invalid"`) {
			t.Errorf("GET %s: HTTP %d %s, want %d", path, resp.StatusCode, b, want)
		}
	}

	// worker claims the next turn and ends it: succeeded, or failed with
	// its retained session gone (which loses the conversation, R31).
	worker := func(succeed bool) error {
		c, err := wc.Claim(ctx, hostToken, wire.ClaimRequest{WaitMS: 10_000})
		if err != nil {
			return err
		}
		r := wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}
		if _, err := wc.Events(ctx, c.WorkerToken, c.JobID, wire.EventsRequest{AttemptRef: r,
			Events: []wire.Event{{Seq: 1, Time: time.Now(), Type: "agent.output"}}}); err != nil {
			return err
		}
		if _, err := wc.Admission(ctx, c.WorkerToken, c.JobID, wire.AdmissionRequest{AttemptRef: r, ActivationID: "a1"}); err != nil {
			return err
		}
		fin := wire.FinishRequest{AttemptRef: r, Outcome: wire.OutcomeFailed, Class: "workspace_missing", Unrecoverable: true}
		if succeed {
			if _, err := wc.Settlement(ctx, c.WorkerToken, c.JobID, wire.SettlementRequest{AttemptRef: r, ActivationID: "a1",
				Supervisor: wire.SupervisorReceipt{ActivationID: "a1", ReceiptID: "r1", NativeTurn: 1}}); err != nil {
				return err
			}
			fin.Outcome = wire.OutcomeSucceeded
		}
		_, err = wc.Finish(ctx, c.WorkerToken, c.JobID, fin)
		return err
	}
	submitEnv := envOf(t, map[string]string{"CONTROLPLANE_SERVER": addr, "CONTROLPLANE_DATA_DIR": dir})

	done := make(chan error, 1)
	go func() { done <- worker(true) }()
	code, stdout, stderr = runCmd(t, submitEnv, "submit", "--new", "--image", "demo", "--agent", "demoagent --fast", "--prompt", "hi")
	if err := <-done; err != nil {
		t.Fatalf("worker: %v", err)
	}
	if code != exitOK || !strings.Contains(stdout, "agent.output") || !strings.Contains(stdout, "turn 1: succeeded") {
		t.Fatalf("submit of a succeeding turn: exit %d\n%s%s", code, stdout, stderr)
	}
	conv := strings.TrimPrefix(strings.SplitN(stdout, "\n", 2)[0], "conversation ")

	go func() { done <- worker(false) }()
	code, stdout, stderr = runCmd(t, submitEnv, "submit", "--conversation", conv, "--prompt", "again")
	if err := <-done; err != nil {
		t.Fatalf("worker: %v", err)
	}
	if code != exitFail || !strings.Contains(stdout, "turn 2: failed") || !strings.Contains(stdout, "no longer available") {
		t.Fatalf("submit of a failing turn: exit %d\n%s%s", code, stdout, stderr)
	}
	code, _, stderr = runCmd(t, submitEnv, "submit", "--conversation", conv, "--prompt", "still there?")
	if code != exitFail || !strings.Contains(stderr, "no longer available") {
		t.Fatalf("submit to a lost conversation: exit %d, %q", code, stderr)
	}

	stop()
	if code := <-served; code != exitOK {
		t.Fatalf("serve after the signal: exit %d\n%s", code, logs.String())
	}
	<-drained
	if !strings.Contains(logs.String(), "controlplane: stopped") {
		t.Fatalf("serve did not say it stopped:\n%s", logs.String())
	}
	userToken, _ := os.ReadFile(filepath.Join(dir, "user-token"))
	for _, secret := range []string{hostToken, strings.TrimSpace(string(userToken))} {
		if strings.Contains(logs.String(), secret) {
			t.Fatal("serve's output holds a token")
		}
	}
}

// K9: the command opens SQLite with synchronous=FULL unless the operator
// asks for normal, on the command line or in the environment.
func TestSQLiteSynchronousDefaultsToFull(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want sqlstore.Synchronous
	}{
		{"default", nil, nil, sqlstore.SyncFull},
		{"normal by flag", nil, []string{"--sqlite-synchronous", "normal"}, sqlstore.SyncNormal},
		{"normal by env", map[string]string{"CONTROLPLANE_SQLITE_SYNCHRONOUS": "NORMAL"}, nil, sqlstore.SyncNormal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			envOf(t, tc.env)
			f := newFlags("serve", io.Discard)
			d := addDBFlags(f)
			if err := f.parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if err := d.check(); err != nil {
				t.Fatal(err)
			}
			if got := d.synchronous(); got != tc.want {
				t.Fatalf("synchronous %s, want %s", got, tc.want)
			}
		})
	}
}

// K9 through serve itself: the level its SQLite writer connection runs
// at, read back from that connection (PRAGMA synchronous) and printed on
// the serving line — FULL by default and when asked for, NORMAL only when
// asked for. TestSQLiteSynchronousDefaultsToFull reads the flag alone.
func TestServeWriterSynchronous(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"default", nil, "full"},
		{"full by flag", []string{"--sqlite-synchronous", "full"}, "full"},
		{"normal by flag", []string{"--sqlite-synchronous", "normal"}, "normal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startServe(t, append([]string{"--data-dir", t.TempDir()}, tc.args...)...) // returns once the serving line is out
			req, err := http.NewRequest(http.MethodGet, r.addr+"/readyz", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Close = true
			resp, err := http.DefaultClient.Do(req) // answered: its start-up is over before it is stopped
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			var line string
			for l := range strings.Lines(r.logs.String()) {
				if strings.Contains(l, "serving ") {
					line = l
				}
			}
			if !strings.HasSuffix(strings.TrimSpace(line), "(synchronous="+tc.want+")") {
				t.Fatalf("serve %v: serving line %q, want the writer's synchronous=%s\n%s", tc.args, line, tc.want, r.logs.String())
			}
		})
	}
}

// controlplane --version and version print the version; --help, -h and
// help the commands; all exit 0.
func TestVersionAndHelp(t *testing.T) {
	for _, arg := range []string{"--version", "-version", "version"} {
		if code, stdout, _ := runCmd(t, noEnv, arg); code != exitOK || stdout != version+"\n" {
			t.Errorf("controlplane %s: exit %d, stdout %q", arg, code, stdout)
		}
	}
	for _, arg := range []string{"--help", "-h", "help"} {
		if code, stdout, _ := runCmd(t, noEnv, arg); code != exitOK || !strings.Contains(stdout, "commands:") {
			t.Errorf("controlplane %s: exit %d, stdout %q", arg, code, stdout)
		}
	}
}

// --config FILE (or CONTROLPLANE_CONFIG) is the third source: below the
// command line and the variables; an unknown setting is refused in one
// line, a missing file names its path.
func TestConfigFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "cp.conf")
	if err := os.WriteFile(file, []byte("# control plane\nlisten 127.0.0.1:7000\nreaper-interval 7s\nmax-worker-lost 4\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	envOf(t, map[string]string{"CONTROLPLANE_REAPER_INTERVAL": "9s"})
	f := newFlags("serve", io.Discard)
	listen := f.fs.String("listen", "127.0.0.1:8080", "")
	interval := f.fs.Duration("reaper-interval", time.Second, "")
	lost := f.fs.Int("max-worker-lost", 3, "")
	if err := f.parse([]string{"--config", file, "--max-worker-lost", "5"}); err != nil {
		t.Fatal(err)
	}
	if *listen != "127.0.0.1:7000" || *interval != 9*time.Second || *lost != 5 {
		t.Fatalf("listen %q (file), reaper interval %v (variable over file), max worker lost %d (flag over file)", *listen, *interval, *lost)
	}
	missing := filepath.Join(dir, "nope.conf")
	code, _, stderr := runCmd(t, noEnv, "serve", "--config", missing)
	if code != exitUsage || !strings.Contains(stderr, missing) || strings.Count(stderr, "\n") != 1 {
		t.Fatalf("missing config file: exit %d, %q", code, stderr)
	}
	if err := os.WriteFile(file, []byte("reaper-intervall 7s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runCmd(t, noEnv, "serve", "--config", file)
	if code != exitUsage || !strings.Contains(stderr, `"reaper-intervall" not defined`) {
		t.Fatalf("unknown setting: exit %d, %q", code, stderr)
	}
}

// A refusal shows the control plane's own sentence beside its code: the
// code alone does not say what to change.
func TestSubmitShowsTheServersMessage(t *testing.T) {
	dir := t.TempDir()
	r := startServe(t, "--data-dir", dir)
	code, _, stderr := runCmd(t, noEnv, "submit", "--server", r.addr, "--data-dir", dir,
		"--conversation", "conv_nosuchconversation", "--prompt", "hello")
	t.Logf("stderr: %s", stderr)
	if code != exitFail || !strings.Contains(stderr, "HTTP 404") {
		t.Fatalf("exit %d, stderr %q; want exit %d and the status", code, stderr, exitFail)
	}
	if !regexp.MustCompile(`HTTP 404 not_found: \S`).MatchString(stderr) {
		t.Errorf("stderr %q has no message from the server after the code", stderr)
	}
}
