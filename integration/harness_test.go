package integration

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/internal/tlsfiles"
	"github.com/runnerd/runnerd/internal/tlsfiles/tlstest"
	"github.com/runnerd/runnerd/wire"
)

// Scaled timings (issue 6): the defaults' 120 s / 30 s / 10 s / 5 s become
// 1.2 s / 300 ms / 100 ms / 50 ms. The reaper's grace is at least the
// runner's stop grace plus its kill grace (P3).
const (
	leaseTTL       = 1200 * time.Millisecond
	renewEvery     = 300 * time.Millisecond
	renewTimeout   = 100 * time.Millisecond
	renewRetry     = 50 * time.Millisecond
	stopGrace      = 200 * time.Millisecond
	killGrace      = 200 * time.Millisecond
	reaperGrace    = time.Second // stop + kill grace, and room for the supervisor to kill the agent
	reaperInterval = 100 * time.Millisecond

	tick    = 20 * time.Millisecond // polling period of the user API
	waitFor = 45 * time.Second      // bound of every wait: generous for a loaded machine
)

// bins are the binaries TestMain built for this run.
var bins fleet.Binaries

func TestMain(m *testing.M) {
	os.Exit(buildAndRun(m))
}

// envBinDir names a directory of binaries built already (`make build`
// leaves them in bin/); unset, the test builds its own.
const envBinDir = "RUNNERD_INTEGRATION_BIN"

func buildAndRun(m *testing.M) int {
	defer previous.remove()
	if dir := os.Getenv(envBinDir); dir != "" {
		var err error
		if bins, err = fleet.BinariesIn(dir); err != nil {
			fmt.Fprintln(os.Stderr, "integration:", envBinDir+":", err)
			return 1
		}
		return runChecked(m)
	}
	dir, err := os.MkdirTemp("", "runnerd-integration-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	root, err := moduleRoot()
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		bins, err = fleet.Build(ctx, root, dir)
		cancel()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration: build the binaries:", err)
		return 1
	}
	return runChecked(m)
}

// runChecked runs the tests, then checks that none left a goroutine behind.
func runChecked(m *testing.M) int {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "integration: goroutines left behind:", err)
			return 1
		}
	}
	return code
}

// previousRelease is the commit of the release before this one:
// protocol v3 turn children that outlive their daemon, and supervisors that
// answer status without a protocol version.
const previousRelease = "1eb0371"

// envRequireHistory makes a missing previousRelease a failure instead of a
// skip (.ci/run sets it on a full clone).
const envRequireHistory = "RUNNERD_REQUIRE_HISTORY"

// previous is the previous release's runnerd, built at most once per test
// binary: from git history, which a shallow clone or a source tarball
// lacks.
var previous previousBuild

type previousBuild struct {
	once    sync.Once
	dir     string // removed by buildAndRun
	runnerd string
	skip    string // why there is no previous release here
	err     error
}

func (p *previousBuild) remove() {
	if p.dir != "" {
		os.RemoveAll(p.dir)
	}
}

// previousRunnerd is the path of the previous release's runnerd, built on
// first use. Without git or the commit the test is skipped, saying why,
// unless RUNNERD_REQUIRE_HISTORY=1.
func previousRunnerd(t *testing.T) string {
	t.Helper()
	previous.once.Do(buildPrevious)
	switch {
	case previous.err != nil:
		t.Fatalf("build the previous release %s: %v", previousRelease, previous.err)
	case previous.skip != "" && os.Getenv(envRequireHistory) == "1":
		t.Fatalf("%s=1, but %s", envRequireHistory, previous.skip)
	case previous.skip != "":
		t.Skipf("no previous release to upgrade from: %s (set %s=1 to make this a failure)", previous.skip, envRequireHistory)
	}
	return previous.runnerd
}

func buildPrevious() {
	root, err := moduleRoot()
	if err != nil {
		previous.err = err
		return
	}
	if _, err := exec.LookPath("git"); err != nil {
		previous.skip = "git is not installed"
		return
	}
	if exec.Command("git", "-C", root, "cat-file", "-e", previousRelease+"^{commit}").Run() != nil {
		previous.skip = "commit " + previousRelease + " is not in this checkout's history (a shallow clone or a source archive)"
		return
	}
	if previous.dir, err = os.MkdirTemp("", "runnerd-previous-"); err != nil {
		previous.err = err
		return
	}
	src := filepath.Join(previous.dir, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		previous.err = err
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	archive := exec.CommandContext(ctx, "sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", root, previousRelease, src)
	if out, err := archive.CombinedOutput(); err != nil {
		previous.err = fmt.Errorf("git archive: %w\n%s", err, out)
		return
	}
	previous.runnerd = filepath.Join(previous.dir, "runnerd")
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", previous.runnerd, "./cmd/runnerd")
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod")
	if out, err := build.CombinedOutput(); err != nil {
		previous.err = fmt.Errorf("go build: %w\n%s", err, out)
	}
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the module")
	}
	return filepath.Dir(mod), nil
}

// env is one test's world: a control plane on SQLite in its own
// directory, a host registered with it, optionally a proxy between them,
// and its own hard link of runnerd, so that every process of this test —
// daemon, turn children, supervisors — is told apart by its executable.
type env struct {
	t        *testing.T
	ctx      context.Context
	dir      string
	cp       *fleet.ControlPlane
	user     *fleet.User
	proxy    *proxy
	faults   *faultProxy
	runnerd  string
	child    string // the test's runnerd-child beside runnerd; "" without envOpts.leanChild
	stateDir string
	host     string
	token    string
	log      *testLog
	tls      *tlsEnv // envOpts.tls: the control plane serves HTTPS and requires client certificates
}

// tlsEnv is the certificates of a TLS test: one CA signs the control
// plane's pair and the daemon's client certificate.
type tlsEnv struct {
	ca     *tlstest.CA
	server tlstest.Pair
	client tlstest.Pair
}

type envOpts struct {
	leaseTTL time.Duration // the control plane's lease; default leaseTTL
	proxy    bool          // a TCP proxy that can black-hole
	faults   bool          // an HTTP proxy that can refuse an operation
	// leanChild links runnerd-child beside the test's runnerd, so that its
	// process turns and supervisors run the lean entry point (the default
	// of a `make build` install); without it they run runnerd itself.
	leanChild bool
	// tls serves the control plane over HTTPS with --client-ca (mTLS); the
	// daemon gets --ca-file and a client certificate.
	tls bool
	// db is the control plane's --db (a PostgreSQL DSN that replicas can
	// share); "" is SQLite in its data directory.
	db string
}

func newEnv(t *testing.T, o envOpts) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dir := t.TempDir()
	e := &env{t: t, ctx: ctx, dir: dir, stateDir: filepath.Join(dir, "state"), host: "host-" + sanitize(t.Name())}
	e.log = newTestLog(t, filepath.Join(dir, "output.log"))
	// Registered first, so it runs last: whatever of this test is still
	// running after the daemons and the control plane stopped is killed.
	t.Cleanup(e.killLeftovers)

	e.runnerd = filepath.Join(dir, "runnerd")
	if err := linkOrCopy(bins.Runnerd, e.runnerd); err != nil {
		t.Fatalf("link runnerd: %v", err)
	}
	if o.leanChild {
		e.child = filepath.Join(dir, "runnerd-child")
		if err := linkOrCopy(bins.RunnerdChild, e.child); err != nil {
			t.Fatalf("link runnerd-child: %v", err)
		}
	}
	if o.leaseTTL == 0 {
		o.leaseTTL = leaseTTL
	}
	var cpArgs []string
	var userTLS *tls.Config
	if o.tls {
		ca := tlstest.NewCA(t, "fleet")
		e.tls = &tlsEnv{ca: ca, server: ca.Server("controlplane", []string{"127.0.0.1"}, tlstest.Options{}), client: ca.Client(e.host, tlstest.Options{})}
		cpArgs = []string{"--tls-cert", e.tls.server.CertFile, "--tls-key", e.tls.server.KeyFile, "--client-ca", ca.File}
		operator := ca.Client("operator", tlstest.Options{})
		var err error
		if userTLS, err = (tlsfiles.Client{CAFile: ca.File, CertFile: operator.CertFile, KeyFile: operator.KeyFile}).Config(); err != nil {
			t.Fatal(err)
		}
	}
	cp, err := fleet.StartControlPlane(ctx, fleet.ControlPlaneConfig{
		Args:           cpArgs,
		ClientTLS:      userTLS,
		DB:             o.db,
		Bin:            bins.ControlPlane,
		DataDir:        filepath.Join(dir, "cp"),
		LeaseTTL:       o.leaseTTL,
		MinLeaseTTL:    renewEvery + renewTimeout,
		ReaperInterval: reaperInterval,
		ReaperGrace:    reaperGrace,
		ClaimWaitMax:   time.Second,
		ReleaseBackoff: 200 * time.Millisecond, // scaled down with the leases (K7)
		Log:            e.log.prefixed("cp"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.Stop(syscall.SIGTERM, 15*time.Second); err != nil {
			t.Errorf("control plane: %v", err)
		}
		cp.User.Close()
	})
	e.cp, e.user = cp, cp.User
	if e.token, err = cp.AddHost(ctx, e.host); err != nil {
		t.Fatal(err)
	}
	if o.proxy {
		e.proxy = startProxy(t, strings.TrimPrefix(cp.URL, "http://"))
	}
	if o.faults {
		e.faults = startFaultProxy(t, cp.URL)
	}
	return e
}

func linkOrCopy(from, to string) error {
	if os.Link(from, to) == nil {
		return nil
	}
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '-'
	}, s)
}

// calmLease is the lease of a test that never waits for one to run out:
// renewals every two seconds, each given a second, so that a loaded
// machine's slow answers do not end a turn that the test means to end
// some other way. The control plane's lease (envOpts.leaseTTL) and the
// daemon's (calm) go together.
const calmLease = 12 * time.Second

func calm(c *fleet.DaemonConfig) {
	c.LeaseTTL, c.RenewInterval, c.RenewTimeout = calmLease, 2*time.Second, time.Second
}

// daemonConfig is the scaled configuration of this test's daemon.
func (e *env) daemonConfig() fleet.DaemonConfig {
	url := e.cp.URL
	switch {
	case e.proxy != nil:
		url = e.proxy.URL()
	case e.faults != nil:
		url = e.faults.URL()
	}
	// No spare turn child: these tests count and place the turn children
	// of their turns (turnChildren, the scopes), and a spare is a turn
	// child of none. The spare is proved in runner's own tests (its
	// TestSpare*) with real children, and B4 runs it through the real
	// binaries. As a variable, not a flag: a previous release's runnerd
	// (the upgrade tests) has no --spare-child and ignores the variable.
	var args []string
	if e.tls != nil {
		args = append(args, "--ca-file", e.tls.ca.File, "--tls-client-cert", e.tls.client.CertFile, "--tls-client-key", e.tls.client.KeyFile)
	}
	return fleet.DaemonConfig{
		Args:            args,
		Bin:             e.runnerd,
		ControlPlaneURL: url,
		HostTokenFile:   e.token,
		HostName:        e.host,
		StateDir:        e.stateDir,
		Capacity:        4,
		Sandbox:         "process",
		LeaseTTL:        leaseTTL,
		RenewInterval:   renewEvery,
		RenewTimeout:    renewTimeout,
		RenewRetry:      renewRetry,
		ReceiptTimeout:  500 * time.Millisecond,
		ReceiptRetry:    50 * time.Millisecond,
		StopGrace:       stopGrace,
		KillGrace:       killGrace,
		DrainTimeout:    20 * time.Second,
		ClaimWait:       500 * time.Millisecond,
		ClaimBackoff:    100 * time.Millisecond,
		ClaimBackoffMax: time.Second,
		ControlTimeout:  time.Second,
		HostHeartbeat:   200 * time.Millisecond,
		Log:             e.log.prefixed("runnerd"),
		Env:             []string{"RUNNERD_SPARE_CHILD=false"},
	}
}

// startDaemon starts a daemon; t.Cleanup drains it (SIGUSR1, a second one
// 5 s later, then SIGKILL) and waits for it.
func (e *env) startDaemon(mod func(*fleet.DaemonConfig)) *fleet.Daemon {
	e.t.Helper()
	cfg := e.daemonConfig()
	if mod != nil {
		mod(&cfg)
	}
	d, err := fleet.StartDaemon(e.ctx, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.cleanupDaemon(d)
	return d
}

func (e *env) cleanupDaemon(d *fleet.Daemon) {
	e.t.Cleanup(func() {
		// A drain, not SIGTERM's handover: the test's turns end with it.
		d.Signal(syscall.SIGUSR1)
		if d.Wait(5*time.Second) != nil {
			d.Signal(syscall.SIGUSR1) // a second drain request stops the turns now
		}
		if err := d.Stop(syscall.SIGKILL, 10*time.Second); err != nil {
			e.t.Errorf("runnerd: %v", err)
		}
	})
}

// restart starts d again (after it exited) with the same configuration.
func (e *env) restart(d *fleet.Daemon) *fleet.Daemon {
	e.t.Helper()
	nd, err := d.Restart(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	e.cleanupDaemon(nd)
	return nd
}

func (e *env) waitCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(e.ctx, waitFor)
}

// conversation creates a conversation whose agent is the demo agent.
func (e *env) conversation(title string) wire.Conversation {
	e.t.Helper()
	c, err := e.user.CreateConversation(e.ctx, title, bins.DemoAgent)
	if err != nil {
		e.t.Fatalf("create conversation: %v", err)
	}
	return c
}

func (e *env) send(convID, prompt string) wire.Job {
	e.t.Helper()
	j, err := e.user.Send(e.ctx, convID, prompt)
	if err != nil {
		e.t.Fatalf("send to %s: %v", convID, err)
	}
	return j
}

func (e *env) job(id string) wire.Job {
	e.t.Helper()
	j, err := e.user.Job(e.ctx, id)
	if err != nil {
		e.t.Fatalf("read job %s: %v", id, err)
	}
	return j
}

func (e *env) conv(id string) wire.Conversation {
	e.t.Helper()
	c, err := e.user.Conversation(e.ctx, id)
	if err != nil {
		e.t.Fatalf("read conversation %s: %v", id, err)
	}
	return c
}

func (e *env) waitJob(id, what string, cond func(wire.Job) bool) wire.Job {
	e.t.Helper()
	ctx, cancel := e.waitCtx()
	defer cancel()
	j, err := e.user.WaitJob(ctx, id, tick, what, cond)
	if err != nil {
		e.t.Fatalf("%v; job now: %s", err, describeJob(j))
	}
	return j
}

func (e *env) waitEnded(id string) wire.Job {
	e.t.Helper()
	return e.waitJob(id, "to end", func(j wire.Job) bool { return fleet.Ended(j.State) })
}

// waitServer polls Admin → Servers until this test's host satisfies cond.
func (e *env) waitServer(what string, cond func(wire.Server) bool) wire.Server {
	e.t.Helper()
	ctx, cancel := e.waitCtx()
	defer cancel()
	var s wire.Server
	err := fleet.Poll(ctx, tick, "host "+what, func(ctx context.Context) (bool, error) {
		var ok bool
		var err error
		s, ok, err = e.user.Server(ctx, e.host)
		return ok && cond(s), err
	})
	if err != nil {
		e.t.Fatalf("%v; server now: %+v", err, s)
	}
	return s
}

func (e *env) transcript(convID string) []fleet.TranscriptEntry {
	e.t.Helper()
	tr, err := fleet.Transcript(e.stateDir, convID)
	if err != nil {
		e.t.Fatal(err)
	}
	return tr
}

// waitPrompts waits until the agent of convID has received n prompts.
// release ends the demo agent's "!await name" in conversation convID's
// workspace: a turn that lasts until the test lets it end, not for a
// number of seconds a loaded machine may outlast.
func (e *env) release(convID, name string) {
	e.t.Helper()
	if err := os.WriteFile(filepath.Join(fleet.Workspace(e.stateDir, convID), name), nil, 0o644); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) waitPrompts(convID string, n int) []fleet.TranscriptEntry {
	e.t.Helper()
	ctx, cancel := e.waitCtx()
	defer cancel()
	var tr []fleet.TranscriptEntry
	err := fleet.Poll(ctx, tick, fmt.Sprintf("%d prompts to reach the agent of %s", n, convID), func(context.Context) (bool, error) {
		var err error
		tr, err = fleet.Transcript(e.stateDir, convID)
		return len(tr) >= n, err
	})
	if err != nil {
		e.t.Fatalf("%v; transcript: %+v", err, tr)
	}
	return tr
}

// assertPromptsOnce checks that every prompt reached the agent exactly
// once, in order, with the native turn ordinal counting 1, 2, 3, ...
func (e *env) assertPromptsOnce(convID string, prompts ...string) {
	e.t.Helper()
	tr := e.transcript(convID)
	if len(tr) != len(prompts) {
		e.t.Fatalf("conversation %s: the agent received %d prompts, want %d: %+v", convID, len(tr), len(prompts), tr)
	}
	for i, p := range prompts {
		if tr[i].Prompt != p || tr[i].Turn != int64(i+1) {
			e.t.Errorf("conversation %s: prompt %d was %q at native turn %d, want %q at %d", convID, i+1, tr[i].Prompt, tr[i].Turn, p, i+1)
		}
	}
}

// assertLostPromptOnce is assertPromptsOnce for a conversation that became
// LOST with its one prompt delivered: the daemon may have removed its
// sandbox, transcript and all. Then the job's single attempt is the proof
// that the prompt was not sent again, since a LOST conversation takes no
// turn and its job was never claimed anew.
func (e *env) assertLostPromptOnce(convID, prompt string, j wire.Job) {
	e.t.Helper()
	if len(j.Attempts) != 1 {
		e.t.Errorf("the LOST conversation's turn was attempted again: %s", describeJob(j))
	}
	// The daemon removes a LOST conversation's sandbox when its report is
	// answered, so the removal may be under way while the transcript is
	// read: an empty transcript proves nothing until the sandbox is gone
	// or plainly stays.
	if tr := e.transcript(convID); len(tr) > 0 {
		e.assertPromptsOnce(convID, prompt)
		return
	}
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		if _, err := os.Stat(fleet.SandboxDir(e.stateDir, convID)); errors.Is(err, os.ErrNotExist) {
			return
		}
		if tr := e.transcript(convID); len(tr) > 0 {
			e.assertPromptsOnce(convID, prompt)
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	e.assertPromptsOnce(convID, prompt)
}

func describeJob(j wire.Job) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s seq %d state %s outcome %q reason %q attempts %d worker_lost %d admitted %v cancel %v",
		j.ID, j.Seq, j.State, j.Outcome, j.Reason, j.AttemptCount, j.WorkerLostCount, j.Admitted, j.CancelRequested)
	for _, a := range j.Attempts {
		fmt.Fprintf(&b, "\n  attempt %s gen %d %s %q claimed %s expires %s", a.ID, a.Generation, a.State, a.Outcome,
			a.ClaimedAt.Format("15:04:05.000"), a.LeaseExpiresAt.Format("15:04:05.000"))
	}
	for _, ev := range j.Events {
		fmt.Fprintf(&b, "\n  %s %-7s %s %s %s", ev.Time.Format("15:04:05.000"), ev.Source, ev.AttemptID, ev.Type, ev.Data)
	}
	return b.String()
}

// ---- processes ----

// proc is one live process of this test.
type proc = fleet.Proc

// procs lists this test's live processes: those running its runnerd (the
// daemon, turn children, supervisors) and those whose working directory is
// under its state directory (agents).
func (e *env) procs() []proc {
	ps, err := fleet.Procs(fleet.Executable(e.runnerd, e.child), fleet.Under(e.stateDir))
	if err != nil {
		e.t.Fatal(err)
	}
	return ps
}

// turnChildren are this test's live `runnerd turn` processes.
func (e *env) turnChildren() []proc {
	var out []proc
	for _, p := range e.procs() {
		if p.Argv[0] == e.runnerd && len(p.Argv) > 1 && p.Argv[1] == "turn" {
			out = append(out, p)
		}
	}
	return out
}

// agents are this test's live agent processes of one conversation.
func (e *env) agents(convID string) []proc {
	var out []proc
	ws := fleet.Workspace(e.stateDir, convID)
	for _, p := range e.procs() {
		if p.Argv[0] == bins.DemoAgent && (p.Cwd == ws || strings.HasPrefix(p.Cwd, ws+"/")) {
			out = append(out, p)
		}
	}
	return out
}

var (
	waitGone = fleet.WaitGone
	alive    = fleet.Alive
)

// killLeftovers kills whatever of this test still runs — supervisors
// outlive daemons by design — and waits for each to go.
func (e *env) killLeftovers() {
	if _, err := fleet.StopProcs(5*time.Second, fleet.Executable(e.runnerd, e.child), fleet.Under(e.stateDir)); err != nil {
		e.t.Errorf("cleanup: %v", err)
	}
}

// ---- output ----

// testLog collects the output of the test's processes in a file and shows
// its tail when the test fails.
type testLog struct {
	mu sync.Mutex
	f  *os.File
}

func newTestLog(t *testing.T, path string) *testLog {
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	l := &testLog{f: f}
	t.Cleanup(func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if t.Failed() || testing.Verbose() && os.Getenv("INTEGRATION_SHOW_LOG") != "" {
			_, _ = f.Seek(0, io.SeekStart)
			var lines []string
			sc := bufio.NewScanner(f)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				lines = append(lines, sc.Text())
			}
			if len(lines) > 300 {
				lines = lines[len(lines)-300:]
			}
			t.Logf("last %d lines of the processes' output (%s):\n%s", len(lines), path, strings.Join(lines, "\n"))
		}
		f.Close()
	})
	return l
}

type prefixWriter struct {
	l      *testLog
	prefix string
}

func (l *testLog) prefixed(p string) io.Writer { return &prefixWriter{l: l, prefix: p} }

func (w *prefixWriter) Write(b []byte) (int, error) {
	w.l.mu.Lock()
	defer w.l.mu.Unlock()
	fmt.Fprintf(w.l.f, "%s %s| %s", time.Now().Format("15:04:05.000"), w.prefix, b)
	return len(b), nil
}
