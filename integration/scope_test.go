package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// systemdImage is the image of a Debian system with systemd and D-Bus,
// built here with debootstrap and `docker import` (the recipe of
// shared/design/architecture.md, "Verified here"). It is kept under this
// name and reused: building it takes a minute.
const systemdImage = "runnerd-test-systemd:bookworm-1"

// TestSystemdRestartKeepsScopes installs deploy/runnerd.service with
// deploy/runnerd-docker.conf's root in a real systemd (a container) and
// upgrades the daemon during a turn: a second build replaces the binary,
// then `systemctl restart runnerd`. The daemon moved the turn child into a
// transient scope of its own before it started anything, so the turn's
// supervisor (process backend), which outlives the turn by design, is in
// that scope too, and the service's cgroup holds the daemon alone. The stop
// hands the turn over (SIGTERM) and the new build re-attaches it: the turn
// completes on its one attempt, the prompt once, and the same supervisor
// process, in the same scope, serves the conversation's next turn. (The
// unprivileged unit, without scopes, is TestSystemdUpgradeKeepsTurns.)
//
// It skips when no Docker engine answers or the image cannot be built
// (no debootstrap), unless RUNNERD_REQUIRE_DOCKER=1.
func TestSystemdRestartKeepsScopes(t *testing.T) {
	t.Parallel()
	requireDocker(t)
	buildSystemdImage(t)
	next := buildNextRunnerd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	e, c, first := systemdHost(t, ctx, true, hostOpts{leaseTTL: sdLease})
	if got := c.journal(); !strings.Contains(got, `"msg":"runnerd_turn_scopes","mechanism":"systemd_scope"`) {
		t.Fatalf("the daemon did not record systemd scopes as its mechanism:\n%s", got)
	}

	conv, err := e.user.CreateConversation(e.ctx, "scopes", "/usr/local/bin/demoagent")
	if err != nil {
		t.Fatal(err)
	}
	prompt1 := "work through a restart\n!await go-on"
	j1 := e.send(conv.ID, prompt1)
	e.waitPrompts(conv.ID, 1)

	// The turn child, its supervisor and its agent are in the attempt's
	// scope; the service's cgroup holds the daemon alone.
	j := e.job(j1.ID)
	if len(j.Attempts) != 1 {
		t.Fatalf("want one attempt: %s", describeJob(j))
	}
	scope := "runnerd-turn-" + j.ID + "-" + j.Attempts[0].ID + ".scope"
	ps := c.procs()
	child := ps.one(t, "turn child", func(p ctrProc) bool { return p.runnerd("turn") })
	sup := ps.one(t, "supervisor", func(p ctrProc) bool { return p.runnerd("supervise") })
	agent := ps.one(t, "agent", func(p ctrProc) bool { return strings.HasPrefix(p.cmdline, "/usr/local/bin/demoagent") })
	for _, p := range []ctrProc{child, sup, agent} {
		if !strings.HasSuffix(p.cgroup, "/"+scope) {
			t.Errorf("pid %d (%s) is in cgroup %s, want scope %s", p.pid, p.cmdline, p.cgroup, scope)
		}
	}
	for _, p := range ps {
		if strings.HasSuffix(p.cgroup, "/runnerd.service") && p.pid != first {
			t.Errorf("pid %d (%s) is in the service's cgroup beside the daemon %d", p.pid, p.cmdline, first)
		}
	}
	if st := c.sh("systemctl is-active " + scope + " || true"); strings.TrimSpace(st) != "active" {
		t.Errorf("systemctl is-active %s: %q", scope, st)
	}

	c.upgrade(e, first, next, j1.ID)
	e.release(conv.ID, "go-on")
	if j := e.waitEnded(j1.ID); j.State != wire.JobSucceeded || len(j.Attempts) != 1 || j.WorkerLostCount != 0 {
		t.Fatalf("the turn in flight during the restart: %s", describeJob(j))
	}
	after := c.procs()
	kept, ok := after.pid(sup.pid)
	switch {
	case !ok || !kept.runnerd("supervise"):
		t.Fatalf("the supervisor %d did not survive the restart: %+v", sup.pid, after)
	case kept.cgroup != sup.cgroup:
		t.Errorf("the supervisor moved from %s to %s", sup.cgroup, kept.cgroup)
	}

	// The next message runs on the same supervisor, its child in a scope
	// of its own.
	prompt2 := "and after it"
	j2 := e.send(conv.ID, prompt2)
	if j := e.waitEnded(j2.ID); j.State != wire.JobSucceeded {
		t.Fatalf("the turn after the restart: %s", describeJob(j))
	}
	e.assertPromptsOnce(conv.ID, prompt1, prompt2)
	if raw, err := os.ReadFile(filepath.Join(fleet.SandboxDir(e.stateDir, conv.ID), "supervisor.pid")); err != nil || strings.TrimSpace(string(raw)) != strconv.Itoa(sup.pid) {
		t.Errorf("the second turn's supervisor is %q (%v), want the first's, %d", raw, err, sup.pid)
	}
	if got := c.journal(); !strings.Contains(got, `"scope":"runnerd-turn-`+j2.ID+`-`) {
		t.Errorf("the second turn's acceptance names no scope of its own:\n%s", got)
	}
}

// sdLease is the lease of the tests that restart the daemon under systemd:
// it outlasts the restart with room for a loaded machine, so that the new
// daemon finds the lease still valid and re-attaches before the child's
// own deadline (K5).
const sdLease = 30 * time.Second

// nextVersion is the version of the second build an upgrade installs.
const nextVersion = "upgrade-test"

var (
	nextOnce sync.Once
	nextBin  string
	nextErr  error
)

// buildNextRunnerd builds runnerd a second time, as the next release to
// upgrade to: the same source with its own version (runnerd_started and
// Admin → Servers show which build runs), once per run of the tests.
func buildNextRunnerd(t *testing.T) string {
	t.Helper()
	nextOnce.Do(func() {
		root, err := moduleRoot()
		if err != nil {
			nextErr = err
			return
		}
		dir, err := os.MkdirTemp("", "runnerd-next-")
		if err != nil {
			nextErr = err
			return
		}
		nextBin = filepath.Join(dir, "runnerd")
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-X main.version="+nextVersion, "-o", nextBin, "./cmd/runnerd")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			nextErr = fmt.Errorf("go build the next runnerd: %w\n%s", err, out)
		}
	})
	if nextErr != nil {
		t.Fatal(nextErr)
	}
	return nextBin
}

// upgrade is the operator's upgrade (docs/operations.md, "Upgrading
// runnerd") of the daemon whose main pid is first during the turn of job:
// the next build replaces the binary, then `systemctl restart runnerd`. The
// old daemon handed the turn over (runnerd_handover_started,
// runnerd_turn_handed_over, runnerd_stopped with handed_over 1), the new
// build runs (its version in runnerd_started and on Admin → Servers) and
// re-attached the turn (runnerd_turn_reattached).
func (c *sdContainer) upgrade(e *env, first int, next, job string) {
	c.t.Helper()
	c.copyIn(next, "/usr/bin/runnerd.new", "0755")
	c.sh("mv /usr/bin/runnerd.new /usr/bin/runnerd && systemctl restart runnerd")
	c.upgraded(e, first, job)
}

// upgraded checks what an upgrade during the turn of job left: a new main
// pid, the turn handed over by the daemon whose main pid was first and
// re-attached by the next build (nextVersion), nothing drained or stopped.
func (c *sdContainer) upgraded(e *env, first int, job string) {
	c.t.Helper()
	t := c.t
	if c.mainPID() == first {
		t.Fatalf("runnerd's main pid is still %d after the restart", first)
	}
	if j := e.job(job); j.State != wire.JobRunning {
		t.Errorf("the turn ended before the new daemon took it over: %s", describeJob(j))
	}
	err := fleet.Poll(c.ctx, 100*time.Millisecond, "runnerd_turn_reattached for "+job, func(context.Context) (bool, error) {
		return strings.Contains(c.journal(), `"msg":"runnerd_turn_reattached","job_id":"`+job+`"`), nil
	})
	if err != nil {
		t.Fatalf("%v:\n%s", err, c.journal())
	}
	got := c.journal()
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`"msg":"runnerd_handover_started","running":1`),
		regexp.MustCompile(`"msg":"runnerd_turn_handed_over","job_id":"` + job + `"`),
		regexp.MustCompile(`"msg":"runnerd_stopped","handover":true,"handed_over":1,"unanswered":0`),
		regexp.MustCompile(`"msg":"runnerd_started","version":"` + nextVersion + `"`),
	} {
		if !want.MatchString(got) {
			t.Errorf("no %s in the journal", want)
		}
	}
	if strings.Contains(got, `"msg":"runnerd_drain_started"`) || strings.Contains(got, `"msg":"runnerd_turn_stopped"`) {
		t.Errorf("the restart drained or stopped a turn")
	}
	if err := fleet.Poll(c.ctx, 100*time.Millisecond, "Admin → Servers to show the new build", func(ctx context.Context) (bool, error) {
		srv, ok, err := e.user.Server(ctx, e.host)
		return ok && srv.Version == nextVersion, err
	}); err != nil {
		t.Error(err)
	}
}

// hostOpts changes systemdHost's defaults.
type hostOpts struct {
	leaseTTL time.Duration // the control plane's and the daemon's lease (renewed every fifth); default leaseTTL
	unit     string        // more lines of the test's drop-in, in [Service]
}

// systemdHost starts a systemd container with deploy/runnerd.service
// installed and started against this test's control plane: as shipped
// (the runnerd user, deploy/runnerd.sysusers.conf) or, asRoot, with
// deploy/runnerd-docker.conf's root; the process backend either way, and
// the test's scaled timings (every flag has a RUNNERD_ variable). It
// returns the daemon's main pid.
func systemdHost(t *testing.T, ctx context.Context, asRoot bool, o hostOpts) (*env, *sdContainer, int) {
	t.Helper()
	e := newEnv(t, envOpts{leaseTTL: o.leaseTTL})
	stateDir := filepath.Join(e.dir, "container-state")
	if err := os.Mkdir(stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	e.stateDir = stateDir // the transcript helpers read the container's /var/lib/runnerd here
	c := startSystemd(t, ctx, stateDir)
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	c.copyIn(bins.Runnerd, "/usr/bin/runnerd", "0755")
	c.copyIn(bins.DemoAgent, "/usr/local/bin/demoagent", "0755")
	c.copyIn(filepath.Join(root, "deploy/runnerd.service"), "/etc/systemd/system/runnerd.service", "0644")
	c.sh("mkdir -p /etc/systemd/system/runnerd.service.d /etc/runnerd /etc/sysusers.d && chmod 0700 /etc/runnerd")
	c.copyIn(filepath.Join(root, "deploy/runnerd.sysusers.conf"), "/etc/sysusers.d/runnerd.conf", "0644")
	c.sh("systemd-sysusers")
	if asRoot {
		c.copyIn(filepath.Join(root, "deploy/runnerd-docker.conf"), "/etc/systemd/system/runnerd.service.d/docker.conf", "0644")
	}
	c.write("/etc/systemd/system/runnerd.service.d/test.conf", "[Service]\nEnvironment=RUNNERD_SANDBOX=process\nEnvironment=RUNNERD_SPARE_CHILD=false\n"+o.unit)
	c.copyIn(e.token, "/etc/runnerd/host-token", "0600")
	c.write("/etc/runnerd/runnerd.env", e.unitEnv(o))
	c.sh("systemctl daemon-reload && systemctl start runnerd")
	return e, c, c.mainPID()
}

// unitEnv is /etc/runnerd/runnerd.env for a daemon of e under systemd: its
// control plane and the test's scaled timings (every flag has a RUNNERD_
// variable).
func (e *env) unitEnv(o hostOpts) string {
	cfg := e.daemonConfig()
	lease, every, timeout := leaseTTL, renewEvery, renewTimeout
	if o.leaseTTL != 0 {
		lease, every, timeout = o.leaseTTL, o.leaseTTL/5, o.leaseTTL/20
	}
	var env strings.Builder
	for _, kv := range [][2]string{
		{"CONTROL_PLANE", cfg.ControlPlaneURL}, {"HOST_NAME", cfg.HostName}, {"CAPACITY", "2"},
		{"LEASE_TTL", lease.String()}, {"RENEW_INTERVAL", every.String()},
		{"RENEW_TIMEOUT", timeout.String()}, {"RENEW_RETRY", renewRetry.String()},
		{"RECEIPT_TIMEOUT", cfg.ReceiptTimeout.String()}, {"RECEIPT_RETRY", cfg.ReceiptRetry.String()},
		{"STOP_GRACE", stopGrace.String()}, {"KILL_GRACE", killGrace.String()},
		{"DRAIN_TIMEOUT", cfg.DrainTimeout.String()}, {"CLAIM_WAIT", cfg.ClaimWait.String()},
		{"CLAIM_BACKOFF", cfg.ClaimBackoff.String()}, {"CLAIM_BACKOFF_MAX", cfg.ClaimBackoffMax.String()},
		{"CONTROL_TIMEOUT", cfg.ControlTimeout.String()}, {"HOST_HEARTBEAT_INTERVAL", cfg.HostHeartbeat.String()},
	} {
		fmt.Fprintf(&env, "RUNNERD_%s=%s\n", kv[0], kv[1])
	}
	return env.String()
}

// TestSystemdUpgradeKeepsTurns (P5) installs deploy/runnerd.service as
// shipped: the daemon runs as the runnerd user, whom the manager refuses
// transient units (no polkit grant). The daemon says so once at start
// (runnerd_turn_scopes, mechanism none, reason access_denied) and its turns
// run in the service's cgroup. During a long silent turn the operator
// upgrades it (a second build replaces the binary, `systemctl restart
// runnerd`): KillMode=process leaves the turn child, the supervisor and
// the agent where they are, the old daemon hands the turn over and exits,
// and the new build re-attaches it. The turn ends as if nothing had
// happened — succeeded on its one attempt, no worker loss, the prompt
// delivered once — and the conversation's next message runs on the same
// supervisor.
func TestSystemdUpgradeKeepsTurns(t *testing.T) {
	t.Parallel()
	requireDocker(t)
	buildSystemdImage(t)
	next := buildNextRunnerd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e, c, first := systemdHost(t, ctx, false, hostOpts{leaseTTL: sdLease})
	if got := c.journal(); !strings.Contains(got, `"msg":"runnerd_turn_scopes","mechanism":"none","reason":"access_denied"`) {
		t.Fatalf("the daemon did not record that it has no scopes, and why:\n%s", got)
	}
	conv, err := e.user.CreateConversation(e.ctx, "upgraded", "/usr/local/bin/demoagent")
	if err != nil {
		t.Fatal(err)
	}
	prompt1 := "through an upgrade\n!events 1\n!await go-on\n!events 1"
	j1 := e.send(conv.ID, prompt1)
	e.waitPrompts(conv.ID, 1)
	ps := c.procs()
	child := ps.one(t, "turn child", func(p ctrProc) bool { return p.runnerd("turn") })
	sup := ps.one(t, "supervisor", func(p ctrProc) bool { return p.runnerd("supervise") })
	agent := ps.one(t, "agent", func(p ctrProc) bool { return strings.HasPrefix(p.cmdline, "/usr/local/bin/demoagent") })
	for _, p := range []ctrProc{child, sup, agent} {
		if !strings.HasSuffix(p.cgroup, "/runnerd.service") {
			t.Errorf("pid %d (%s) is in cgroup %s, want the service's", p.pid, p.cmdline, p.cgroup)
		}
	}

	c.upgrade(e, first, next, j1.ID)
	after := c.procs()
	for _, p := range []ctrProc{child, sup, agent} {
		if q, ok := after.pid(p.pid); ok && q.cmdline != p.cmdline {
			t.Errorf("pid %d is %q now, was %q", p.pid, q.cmdline, p.cmdline)
		}
	}
	if _, ok := after.pid(sup.pid); !ok {
		t.Errorf("the supervisor %d did not survive the restart", sup.pid)
	}
	e.release(conv.ID, "go-on")
	j := e.waitEnded(j1.ID)
	if j.State != wire.JobSucceeded || len(j.Attempts) != 1 || j.WorkerLostCount != 0 {
		t.Fatalf("the turn through the upgrade: %s", describeJob(j))
	}
	if cv := e.conv(conv.ID); cv.State != wire.ConversationUsable || cv.NativeTurn != 1 {
		t.Errorf("the conversation is %s at native turn %d, want usable at 1", cv.State, cv.NativeTurn)
	}
	if strings.Contains(c.journal(), "runnerd_turn_scope_failed") {
		t.Errorf("a turn tried a scope the start probe had ruled out")
	}
	prompt2 := "after the upgrade"
	j2 := e.send(conv.ID, prompt2)
	if j := e.waitEnded(j2.ID); j.State != wire.JobSucceeded {
		t.Fatalf("the turn after the upgrade: %s", describeJob(j))
	}
	e.assertPromptsOnce(conv.ID, prompt1, prompt2)
	if raw, err := os.ReadFile(filepath.Join(fleet.SandboxDir(e.stateDir, conv.ID), "supervisor.pid")); err != nil || strings.TrimSpace(string(raw)) != strconv.Itoa(sup.pid) {
		t.Errorf("the second turn's supervisor is %q (%v), want the first's, %d", raw, err, sup.pid)
	}
}

// TestSystemdDrainTakesHostOutOfService drains the shipped unit's daemon
// with `runnerd drain` during a turn, as an operator taking the host out
// of service: the unit is deactivating while the drain waits (the daemon
// sent STOPPING=1), no new turn is claimed, the running one finishes and
// is reported by this daemon, and the daemon exits 0 — the unit inactive,
// not restarted — after which `runnerd drain` returns and says so.
func TestSystemdDrainTakesHostOutOfService(t *testing.T) {
	t.Parallel()
	requireDocker(t)
	buildSystemdImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e, c, first := systemdHost(t, ctx, false, hostOpts{leaseTTL: sdLease})
	conv, err := e.user.CreateConversation(e.ctx, "drained", "/usr/local/bin/demoagent")
	if err != nil {
		t.Fatal(err)
	}
	const prompt = "finish before the host goes\n!await go-on"
	j := e.send(conv.ID, prompt)
	e.waitPrompts(conv.ID, 1)

	var out bytes.Buffer
	drain := exec.CommandContext(ctx, "docker", "exec", c.id, "/usr/bin/runnerd", "drain")
	drain.Stdout, drain.Stderr = &out, &out
	if err := drain.Start(); err != nil {
		t.Fatal(err)
	}
	if err := fleet.Poll(ctx, 50*time.Millisecond, "the unit to be deactivating", func(ctx context.Context) (bool, error) {
		st, _ := exec.CommandContext(ctx, "docker", "exec", c.id, "systemctl", "show", "-p", "ActiveState", "--value", "runnerd").Output()
		return strings.TrimSpace(string(st)) == "deactivating", nil
	}); err != nil {
		t.Errorf("%v (now: %s)", err, c.sh("systemctl show -p ActiveState --value runnerd"))
	}
	e.waitServer("draining", func(s wire.Server) bool { return s.Draining })
	queued := e.send(e.conversation("not claimed during the drain").ID, "wait")
	e.release(conv.ID, "go-on")
	if err := drain.Wait(); err != nil {
		t.Fatalf("runnerd drain: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), fmt.Sprintf("runnerd (pid %d) drained and exited", first)) {
		t.Errorf("runnerd drain said %q", out.String())
	}
	if got := e.job(j.ID); got.State != wire.JobSucceeded || len(got.Attempts) != 1 {
		t.Fatalf("the drained turn: %s", describeJob(got))
	}
	e.assertPromptsOnce(conv.ID, prompt)
	for prop, want := range map[string]string{"ActiveState": "inactive", "Result": "success", "MainPID": "0"} {
		if got := strings.TrimSpace(c.sh("systemctl show -p " + prop + " --value runnerd")); got != want {
			t.Errorf("after the drain the unit's %s is %q, want %q", prop, got, want)
		}
	}
	if q := e.job(queued.ID); q.State != wire.JobQueued || len(q.Attempts) != 0 {
		t.Errorf("a turn was claimed during the drain: %s", describeJob(q))
	}
	if got := c.journal(); !strings.Contains(got, `"msg":"runnerd_drain_started","running":1`) || !strings.Contains(got, `"msg":"runnerd_stopped","handover":false`) {
		t.Errorf("no runnerd_drain_started / runnerd_stopped of a drain in the journal:\n%s", got)
	}
}

// TestSystemdCrashKeepsTurn kills the daemon's main process under a real
// systemd (SIGKILL, what a crash or the OOM killer does): systemd starts the
// daemon again (Restart=on-failure). The turn child is in its own scope, so
// it is still there, same pid, same scope, and the new daemon
// re-attaches to it: the turn, which lasts until the test lets it end,
// completes, one attempt, the prompt once, and the conversation's next
// message runs on the same supervisor. It holds on whichever cgroup
// hierarchy the host runs, which the start record names.
func TestSystemdCrashKeepsTurn(t *testing.T) {
	t.Parallel()
	requireDocker(t)
	buildSystemdImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// A lease that outlasts systemd's restart with room for a loaded
	// machine; RestartSec shortened from the unit's 5 s.
	e, c, first := systemdHost(t, ctx, true, hostOpts{leaseTTL: sdLease, unit: "RestartSec=100ms\n"})

	// The start record names the hierarchy the host runs, as the host's
	// mount table has it; a turn in its scope survives the crash on each
	// (this machine kind's engine runs cgroup v1 with v2 beside it:
	// hybrid).
	want := "legacy"
	switch strings.TrimSpace(c.sh("stat -fc %T /sys/fs/cgroup; stat -fc %T /sys/fs/cgroup/unified 2>/dev/null || true")) {
	case "cgroup2fs":
		want = "unified"
	case "tmpfs\ncgroup2fs":
		want = "hybrid"
	}
	if got := c.journal(); !strings.Contains(got, `"msg":"runnerd_turn_scopes","mechanism":"systemd_scope","cgroup":"`+want+`"`) {
		t.Errorf("the start record does not name the %s hierarchy:\n%s", want, got)
	}

	conv, err := e.user.CreateConversation(e.ctx, "crash", "/usr/local/bin/demoagent")
	if err != nil {
		t.Fatal(err)
	}
	prompt1 := "through a crash\n!await go-on"
	j1 := e.send(conv.ID, prompt1)
	e.waitPrompts(conv.ID, 1)
	ps := c.procs()
	child := ps.one(t, "turn child", func(p ctrProc) bool { return p.runnerd("turn") })
	sup := ps.one(t, "supervisor", func(p ctrProc) bool { return p.runnerd("supervise") })
	if !strings.Contains(child.cgroup, "/runnerd-turn-"+j1.ID+"-") {
		t.Errorf("the turn child %d is in %s, not in its scope", child.pid, child.cgroup)
	}

	c.sh("systemctl kill -s KILL --kill-whom=main runnerd")
	err = fleet.Poll(ctx, 50*time.Millisecond, "systemd to start runnerd again", func(context.Context) (bool, error) {
		out, _ := exec.CommandContext(ctx, "docker", "exec", c.id, "systemctl", "show", "-p", "MainPID", "--value", "runnerd").Output()
		pid, _ := strconv.Atoi(strings.TrimSpace(string(out)))
		return pid != 0 && pid != first, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	after := c.procs()
	for _, p := range []ctrProc{child, sup} {
		if q, ok := after.pid(p.pid); !ok || q.cmdline != p.cmdline || q.cgroup != p.cgroup {
			t.Errorf("pid %d (%s in %s) did not survive the crash in its scope: %+v", p.pid, p.cmdline, p.cgroup, q)
		}
	}
	err = fleet.Poll(ctx, 100*time.Millisecond, "runnerd_turn_reattached for "+j1.ID, func(context.Context) (bool, error) {
		return strings.Contains(c.journal(), `"msg":"runnerd_turn_reattached","job_id":"`+j1.ID+`"`), nil
	})
	if err != nil {
		t.Fatalf("%v:\n%s", err, c.journal())
	}
	e.release(conv.ID, "go-on")
	j := e.waitEnded(j1.ID)
	if j.State != wire.JobSucceeded || len(j.Attempts) != 1 {
		t.Fatalf("the turn through the crash: %s", describeJob(j))
	}
	prompt2 := "and after it"
	j2 := e.send(conv.ID, prompt2)
	if j := e.waitEnded(j2.ID); j.State != wire.JobSucceeded {
		t.Fatalf("the turn after the crash: %s", describeJob(j))
	}
	e.assertPromptsOnce(conv.ID, prompt1, prompt2)
	if raw, err := os.ReadFile(filepath.Join(fleet.SandboxDir(e.stateDir, conv.ID), "supervisor.pid")); err != nil || strings.TrimSpace(string(raw)) != strconv.Itoa(sup.pid) {
		t.Errorf("the second turn's supervisor is %q (%v), want the first's, %d", raw, err, sup.pid)
	}
}

// requireDocker skips t when no Docker engine answers, unless
// RUNNERD_REQUIRE_DOCKER=1 makes that a failure.
func requireDocker(t *testing.T) {
	t.Helper()
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cctx, "docker", "version", "--format", "{{.Server.Version}}").CombinedOutput()
	if err != nil {
		if os.Getenv("RUNNERD_REQUIRE_DOCKER") == "1" {
			t.Fatalf("RUNNERD_REQUIRE_DOCKER=1 but no Docker engine answers: %v %s", err, out)
		}
		t.Skipf("no Docker engine answers (%v); set RUNNERD_REQUIRE_DOCKER=1 to make this a failure", err)
	}
}

// systemdImageBuild is the one try of this test binary to make
// systemdImage: the tests that need it wait for that try and share its
// outcome, so that a failed build is reported once, not retried by each
// with what is left of its time.
var systemdImageBuild struct {
	once sync.Once
	err  error // why the image could not be made; nil once it exists
}

// buildSystemdImage makes systemdImage unless it exists, with
// testdata/systemd-image.sh (which .ci/run runs before the tests, on an
// idle machine): debootstrap takes a minute or two, more on a loaded one,
// so it has its own bound, counted from the start of the build.
func buildSystemdImage(t *testing.T) {
	t.Helper()
	if exec.Command("docker", "image", "inspect", systemdImage).Run() != nil {
		if _, err := exec.LookPath("debootstrap"); err != nil || os.Geteuid() != 0 {
			if os.Getenv("RUNNERD_REQUIRE_DOCKER") == "1" {
				t.Fatalf("RUNNERD_REQUIRE_DOCKER=1 but the systemd image cannot be built: debootstrap %v, uid %d", err, os.Geteuid())
			}
			t.Skipf("no image %s and no way to build it (debootstrap as root)", systemdImage)
		}
	}
	systemdImageBuild.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "testdata/systemd-image.sh", systemdImage).CombinedOutput()
		if err != nil {
			systemdImageBuild.err = fmt.Errorf("testdata/systemd-image.sh %s: %v\n%s", systemdImage, err, tail(out))
		}
	})
	if systemdImageBuild.err != nil {
		t.Fatal(systemdImageBuild.err)
	}
}

func tail(b []byte) []byte {
	if len(b) > 4000 {
		return b[len(b)-4000:]
	}
	return b
}

// sdContainer is a running systemd container.
type sdContainer struct {
	t   *testing.T
	ctx context.Context
	id  string
}

// startSystemd runs systemd as PID 1 of a container on the host's network
// (the control plane listens on 127.0.0.1), stateDir as /var/lib/runnerd,
// and waits until the system is up.
func startSystemd(t *testing.T, ctx context.Context, stateDir string) *sdContainer {
	t.Helper()
	out, err := exec.CommandContext(ctx, "docker", "run", "-d", "-t", "--network", "host",
		"-e", "container=docker", "--tmpfs", "/run", "--tmpfs", "/run/lock",
		"-v", "/sys/fs/cgroup:/sys/fs/cgroup:ro", "-v", stateDir+":/var/lib/runnerd",
		"--label", "runnerd-test="+sanitize(t.Name()),
		systemdImage, "/lib/systemd/systemd").CombinedOutput()
	if err != nil {
		t.Fatalf("docker run: %v\n%s", err, out)
	}
	c := &sdContainer{t: t, ctx: ctx, id: strings.TrimSpace(string(out))}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("journal of the container:\n%s", c.journal())
		}
		_ = exec.Command("docker", "rm", "-f", c.id).Run()
	})
	err = fleet.Poll(ctx, 100*time.Millisecond, "systemd to come up", func(ctx context.Context) (bool, error) {
		out, _ := exec.CommandContext(ctx, "docker", "exec", c.id, "systemctl", "is-system-running").Output()
		s := strings.TrimSpace(string(out))
		return s == "running" || s == "degraded", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// sh runs script in the container and returns its output; a failure ends the test.
func (c *sdContainer) sh(script string) string {
	c.t.Helper()
	out, err := exec.CommandContext(c.ctx, "docker", "exec", c.id, "sh", "-c", script).CombinedOutput()
	if err != nil {
		c.t.Fatalf("in the container: %s: %v\n%s", script, err, out)
	}
	return string(out)
}

func (c *sdContainer) copyIn(from, to, mode string) {
	c.t.Helper()
	if out, err := exec.CommandContext(c.ctx, "docker", "cp", from, c.id+":"+to).CombinedOutput(); err != nil {
		c.t.Fatalf("docker cp %s: %v\n%s", from, err, out)
	}
	c.sh("chown root:root " + to + " && chmod " + mode + " " + to)
}

func (c *sdContainer) write(path, content string) {
	c.t.Helper()
	cmd := exec.CommandContext(c.ctx, "docker", "exec", "-i", c.id, "sh", "-c", "cat > "+path)
	cmd.Stdin = strings.NewReader(content)
	if out, err := cmd.CombinedOutput(); err != nil {
		c.t.Fatalf("write %s: %v\n%s", path, err, out)
	}
}

func (c *sdContainer) mainPID() int {
	c.t.Helper()
	pid, err := strconv.Atoi(strings.TrimSpace(c.sh("systemctl show -p MainPID --value runnerd")))
	if err != nil || pid == 0 {
		c.t.Fatalf("runnerd has no main pid (%v):\n%s", err, c.sh("systemctl status --no-pager runnerd || true"))
	}
	return pid
}

// journal is runnerd's records as the journal has them.
func (c *sdContainer) journal() string {
	out, _ := exec.Command("docker", "exec", c.id, "journalctl", "--no-pager", "-o", "cat", "-u", "runnerd").CombinedOutput()
	return string(out)
}

// ctrProc is a process of the container, as the container sees it.
type ctrProc struct {
	pid     int
	cmdline string
	cgroup  string // its systemd cgroup path
}

func (p ctrProc) runnerd(role string) bool {
	return strings.HasPrefix(p.cmdline, "/usr/bin/runnerd "+role)
}

type ctrProcs []ctrProc

// procs lists the container's processes with their systemd cgroup: the
// name=systemd hierarchy under cgroup v1, the unified one under v2.
func (c *sdContainer) procs() ctrProcs {
	c.t.Helper()
	const script = `for d in /proc/[0-9]*; do
	cg=$(grep -m1 '^[0-9]*:name=systemd:' $d/cgroup 2>/dev/null || grep -m1 '^0::' $d/cgroup 2>/dev/null) || continue
	cmd=$(tr '\0' ' ' < $d/cmdline 2>/dev/null) || continue
	printf '%s\t%s\t%s\n' "${d#/proc/}" "${cg#*:*:}" "$cmd"
done`
	var ps ctrProcs
	for _, line := range strings.Split(strings.TrimSpace(c.sh(script)), "\n") {
		f := strings.SplitN(line, "\t", 3)
		if len(f) != 3 {
			continue
		}
		pid, err := strconv.Atoi(f[0])
		if err != nil {
			continue
		}
		ps = append(ps, ctrProc{pid: pid, cgroup: f[1], cmdline: strings.TrimSpace(f[2])})
	}
	return ps
}

func (ps ctrProcs) one(t *testing.T, what string, match func(ctrProc) bool) ctrProc {
	t.Helper()
	var found []ctrProc
	for _, p := range ps {
		if match(p) {
			found = append(found, p)
		}
	}
	if len(found) != 1 {
		var b bytes.Buffer
		for _, p := range ps {
			fmt.Fprintf(&b, "\n  %d %s %s", p.pid, p.cgroup, p.cmdline)
		}
		t.Fatalf("want one %s, found %d among:%s", what, len(found), b.String())
	}
	return found[0]
}

func (ps ctrProcs) pid(pid int) (ctrProc, bool) {
	for _, p := range ps {
		if p.pid == pid {
			return p, true
		}
	}
	return ctrProc{}, false
}
