package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

// TestSystemdRestartKeepsScopes installs deploy/runnerd.service in a real
// systemd (a container) and runs `systemctl restart runnerd` during a turn.
// The daemon moved the turn child into a transient scope of its own before
// it started anything, so the turn's supervisor (process backend), which
// outlives the turn by design, is in that scope too: systemd's stop of the
// service (KillMode=mixed) kills what is left in the service's cgroup, and
// the supervisor is not there. After the restart the same supervisor
// process, in the same scope, serves the conversation's next turn.
//
// The unit runs as root here, as deploy/runnerd-docker.conf makes it (the
// manager refuses transient units to the unprivileged runnerd user without
// a polkit grant: docs/operations.md, "Turns in their own scopes"), with
// the process backend. The stop drains, so the turn in flight finishes
// before the daemon exits; a turn that goes on through a restart of the
// daemon, re-attached, is TestSystemdCrashKeepsTurn.
//
// It skips when no Docker engine answers or the image cannot be built
// (no debootstrap), unless RUNNERD_REQUIRE_DOCKER=1.
func TestSystemdRestartKeepsScopes(t *testing.T) {
	t.Parallel()
	requireDocker(t)
	buildSystemdImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	e, c, first := systemdHost(t, ctx, true, hostOpts{})
	if got := c.journal(); !strings.Contains(got, `"msg":"runnerd_turn_scopes","mechanism":"systemd_scope"`) {
		t.Fatalf("the daemon did not record systemd scopes as its mechanism:\n%s", got)
	}

	conv, err := e.user.CreateConversation(e.ctx, "scopes", "/usr/local/bin/demoagent")
	if err != nil {
		t.Fatal(err)
	}
	prompt1 := "work through a restart\n!silent 3s"
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

	// The restart drains: the turn finishes, the daemon exits, systemd
	// kills what is left in the service's cgroup and starts it again.
	c.sh("systemctl restart runnerd")
	second := c.mainPID()
	if second == first {
		t.Fatalf("runnerd's main pid is still %d after the restart", first)
	}
	if j := e.waitEnded(j1.ID); j.State != wire.JobSucceeded || len(j.Attempts) != 1 {
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
	c.copyIn(bins.Runnerd, "/usr/local/bin/runnerd", "0755")
	c.copyIn(bins.DemoAgent, "/usr/local/bin/demoagent", "0755")
	c.copyIn(filepath.Join(root, "deploy/runnerd.service"), "/etc/systemd/system/runnerd.service", "0644")
	c.sh("mkdir -p /etc/systemd/system/runnerd.service.d /etc/runnerd /etc/sysusers.d && chmod 0700 /etc/runnerd")
	c.copyIn(filepath.Join(root, "deploy/runnerd.sysusers.conf"), "/etc/sysusers.d/runnerd.conf", "0644")
	c.sh("systemd-sysusers")
	if asRoot {
		c.copyIn(filepath.Join(root, "deploy/runnerd-docker.conf"), "/etc/systemd/system/runnerd.service.d/docker.conf", "0644")
	}
	c.write("/etc/systemd/system/runnerd.service.d/test.conf", "[Service]\nEnvironment=RUNNERD_SANDBOX=process\n"+o.unit)
	c.copyIn(e.token, "/etc/runnerd/host-token", "0600")
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
	c.write("/etc/runnerd/runnerd.env", env.String())
	c.sh("systemctl daemon-reload && systemctl start runnerd")
	return e, c, c.mainPID()
}

// TestSystemdUnprivilegedUnitHasNoScopes installs deploy/runnerd.service as
// shipped: the daemon runs as the runnerd user, whom the manager refuses
// transient units (no polkit grant). The daemon says so once at start
// (runnerd_turn_scopes, mechanism none, reason access_denied) and its turns
// run in the service's cgroup, as before scopes. What that costs is
// asserted too: a restart kills the process backend's supervisor with the
// service, and the next turn starts a new one over the same workspace
// (its receipts are gone, R28) and succeeds.
func TestSystemdUnprivilegedUnitHasNoScopes(t *testing.T) {
	t.Parallel()
	requireDocker(t)
	buildSystemdImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e, c, first := systemdHost(t, ctx, false, hostOpts{})
	if got := c.journal(); !strings.Contains(got, `"msg":"runnerd_turn_scopes","mechanism":"none","reason":"access_denied"`) {
		t.Fatalf("the daemon did not record that it has no scopes, and why:\n%s", got)
	}
	conv, err := e.user.CreateConversation(e.ctx, "no scopes", "/usr/local/bin/demoagent")
	if err != nil {
		t.Fatal(err)
	}
	j1 := e.send(conv.ID, "first\n!silent 1s")
	e.waitPrompts(conv.ID, 1)
	ps := c.procs()
	child := ps.one(t, "turn child", func(p ctrProc) bool { return p.runnerd("turn") })
	sup := ps.one(t, "supervisor", func(p ctrProc) bool { return p.runnerd("supervise") })
	for _, p := range []ctrProc{child, sup} {
		if !strings.HasSuffix(p.cgroup, "/runnerd.service") {
			t.Errorf("pid %d (%s) is in cgroup %s, want the service's", p.pid, p.cmdline, p.cgroup)
		}
	}
	if j := e.waitEnded(j1.ID); j.State != wire.JobSucceeded {
		t.Fatalf("turn: %s", describeJob(j))
	}
	if strings.Contains(c.journal(), "runnerd_turn_scope_failed") {
		t.Errorf("a turn tried a scope the start probe had ruled out")
	}
	c.sh("systemctl restart runnerd")
	if c.mainPID() == first {
		t.Fatal("runnerd's main pid did not change at the restart")
	}
	if _, ok := c.procs().pid(sup.pid); ok {
		t.Errorf("the supervisor %d in the service's cgroup outlived the restart", sup.pid)
	}
	j2 := e.send(conv.ID, "second")
	if j := e.waitEnded(j2.ID); j.State != wire.JobSucceeded {
		t.Fatalf("the turn after the restart: %s", describeJob(j))
	}
	e.assertPromptsOnce(conv.ID, "first\n!silent 1s", "second")
}

// TestSystemdCrashKeepsTurn kills the daemon's main process under a real
// systemd (SIGKILL, what a crash or the OOM killer does; also the upgrade's
// stop without a drain): systemd kills what is left in the service's cgroup
// and starts the daemon again (Restart=on-failure). The turn child is in its
// own scope, so it is still there, same pid, same scope, and the new daemon
// re-attaches to it: the turn completes, one attempt, the prompt once, and
// the conversation's next message runs on the same supervisor.
func TestSystemdCrashKeepsTurn(t *testing.T) {
	t.Parallel()
	requireDocker(t)
	buildSystemdImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// A lease that outlasts systemd's restart with room for a loaded
	// machine; RestartSec shortened from the unit's 5 s.
	e, c, first := systemdHost(t, ctx, true, hostOpts{leaseTTL: 10 * time.Second, unit: "RestartSec=100ms\n"})

	conv, err := e.user.CreateConversation(e.ctx, "crash", "/usr/local/bin/demoagent")
	if err != nil {
		t.Fatal(err)
	}
	prompt1 := "through a crash\n!silent 4s"
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
	j := e.waitEnded(j1.ID)
	if j.State != wire.JobSucceeded || len(j.Attempts) != 1 {
		t.Fatalf("the turn through the crash: %s", describeJob(j))
	}
	if got := c.journal(); !strings.Contains(got, `"msg":"runnerd_turn_reattached","job_id":"`+j1.ID) {
		t.Errorf("no runnerd_turn_reattached for %s:\n%s", j1.ID, got)
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

// systemdImageMu makes the tests that need systemdImage build it once.
var systemdImageMu sync.Mutex

// buildSystemdImage makes systemdImage unless it exists: debootstrap
// takes a minute or two, more on a loaded machine, so it has its own bound.
func buildSystemdImage(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	systemdImageMu.Lock()
	defer systemdImageMu.Unlock()
	if exec.CommandContext(ctx, "docker", "image", "inspect", systemdImage).Run() == nil {
		return
	}
	if _, err := exec.LookPath("debootstrap"); err != nil || os.Geteuid() != 0 {
		if os.Getenv("RUNNERD_REQUIRE_DOCKER") == "1" {
			t.Fatalf("RUNNERD_REQUIRE_DOCKER=1 but the systemd image cannot be built: debootstrap %v, uid %d", err, os.Geteuid())
		}
		t.Skipf("no image %s and no way to build it (debootstrap as root)", systemdImage)
	}
	dir := filepath.Join(t.TempDir(), "rootfs")
	out, err := exec.CommandContext(ctx, "debootstrap", "--variant=minbase", "--include=systemd,systemd-sysv,dbus", "bookworm", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("debootstrap: %v\n%s", err, tail(out))
	}
	tar := exec.CommandContext(ctx, "tar", "-C", dir, "-c", ".")
	imp := exec.CommandContext(ctx, "docker", "import", "-", systemdImage)
	pipe, err := tar.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	imp.Stdin = pipe
	if err := tar.Start(); err != nil {
		t.Fatal(err)
	}
	if out, err := imp.CombinedOutput(); err != nil {
		t.Fatalf("docker import: %v\n%s", err, out)
	}
	if err := tar.Wait(); err != nil {
		t.Fatalf("tar the root file system: %v", err)
	}
	// debootstrap leaves root-owned device nodes and the like behind.
	_ = exec.Command("rm", "-rf", dir).Run()
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
	return strings.HasPrefix(p.cmdline, "/usr/local/bin/runnerd "+role)
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
