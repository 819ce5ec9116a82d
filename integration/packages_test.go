package integration

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// Package versions of the two builds the package test installs one over
// the other.
const (
	pkgVersion     = "1.0~test1"
	pkgNextVersion = "1.0~test2"
)

// buildPackages runs deploy/packages/build.sh (what `make packages` runs)
// on the static binaries runnerd, runnerd-child and controlplane, and
// returns the directory that holds the two .deb files.
func buildPackages(t *testing.T, runnerd, version string) string {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	for from, name := range map[string]string{runnerd: "runnerd", bins.RunnerdChild: "runnerd-child", bins.ControlPlane: "controlplane"} {
		if from == "" {
			t.Fatalf("no %s binary to package", name)
		}
		if err := linkOrCopy(from, filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	out := t.TempDir()
	cmd := exec.Command(filepath.Join(root, "deploy/packages/build.sh"), bin, out, version)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("deploy/packages/build.sh: %v\n%s", err, b)
	}
	return out
}

// freePort is a loopback port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestPackagesInstallUpgradePurge installs the .deb packages `make
// packages` builds into the debootstrap systemd image, as an operator
// would: dpkg -i makes the users, installs and enables the units (the
// control plane started on its own; runnerd waiting for its token and
// control plane), a turn runs, a newer build installed with dpkg -i while
// a turn runs hands the turn over to the new daemon (the postinst's
// try-restart: P5), the conversation goes on, and a purge leaves neither
// unit, configuration, state nor a process behind.
func TestPackagesInstallUpgradePurge(t *testing.T) {
	t.Parallel()
	requireDocker(t)
	buildSystemdImage(t)
	next := buildNextRunnerd(t)
	first := buildPackages(t, bins.Runnerd, pkgVersion)
	second := buildPackages(t, next, pkgNextVersion)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	e := newEnv(t, envOpts{leaseTTL: sdLease})
	stateDir := filepath.Join(e.dir, "container-state")
	if err := os.Mkdir(stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	e.stateDir = stateDir
	c := startSystemd(t, ctx, stateDir)
	for _, dir := range []string{first, second} {
		for _, p := range []string{"runnerd", "controlplane"} {
			v := pkgVersion
			if dir == second {
				v = pkgNextVersion
			}
			name := fmt.Sprintf("%s_%s_amd64.deb", p, v)
			c.copyIn(filepath.Join(dir, name), "/tmp/"+name, "0644")
		}
	}
	c.copyIn(bins.DemoAgent, "/usr/local/bin/demoagent", "0755")
	dpkg := func(args string) string {
		return c.sh("DEBIAN_FRONTEND=noninteractive dpkg --force-confold " + args)
	}

	// The control plane's package, on a port of this test's choosing,
	// set before the install (the conffile the operator wrote is kept).
	cpPort := freePort(t)
	c.sh("mkdir -p -m 0700 /etc/controlplane")
	c.write("/etc/controlplane/controlplane.env", fmt.Sprintf("CONTROLPLANE_LISTEN=127.0.0.1:%d\n", cpPort))
	c.sh("chmod 0600 /etc/controlplane/controlplane.env")
	dpkg("-i /tmp/controlplane_" + pkgVersion + "_amd64.deb")
	healthy := func(what string) {
		t.Helper()
		err := fleet.Poll(ctx, 100*time.Millisecond, what, func(ctx context.Context) (bool, error) {
			resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", cpPort))
			if err != nil {
				return false, nil
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK, nil
		})
		if err != nil {
			t.Fatalf("%v:\n%s", err, c.sh("systemctl status --no-pager controlplane || true; journalctl --no-pager -u controlplane | tail -20"))
		}
	}
	healthy("the packaged control plane to answer /healthz")
	if got := strings.TrimSpace(c.sh("stat -c '%U %a' /var/lib/controlplane /var/lib/controlplane/user-token /etc/controlplane/controlplane.env")); got != "controlplane 700\ncontrolplane 600\nroot 600" {
		t.Errorf("the control plane's files are owned and moded %q", got)
	}
	c.sh("runuser -u controlplane -- controlplane host add packaged-host --data-dir /var/lib/controlplane --token-file /tmp/packaged-token")
	cpPID := c.sh("systemctl show -p MainPID --value controlplane")

	// runnerd's package: installed and enabled, not started (no token yet).
	dpkg("-i /tmp/runnerd_" + pkgVersion + "_amd64.deb")
	if got := strings.TrimSpace(c.sh("getent passwd runnerd | cut -d: -f6; systemctl is-enabled runnerd; systemctl is-active runnerd || true; stat -c '%U %a' /etc/runnerd /etc/runnerd/runnerd.env")); got != "/var/lib/runnerd\nenabled\ninactive\nroot 700\nroot 600" {
		t.Errorf("after the first install: %q, want the runnerd user, the unit enabled and inactive, /etc/runnerd root's 0700", got)
	}
	c.copyIn(e.token, "/etc/runnerd/host-token", "0600")
	c.write("/etc/runnerd/runnerd.env", "RUNNERD_SANDBOX=process\n"+e.unitEnv(hostOpts{leaseTTL: sdLease}))
	c.sh("systemctl start runnerd")
	firstPID := c.mainPID()

	conv, err := e.user.CreateConversation(e.ctx, "packaged", "/usr/local/bin/demoagent")
	if err != nil {
		t.Fatal(err)
	}
	prompt1 := "through a package upgrade\n!await go-on"
	j1 := e.send(conv.ID, prompt1)
	e.waitPrompts(conv.ID, 1)

	// The newer build over it, the turn running: the postinst restarts the
	// daemon, which is a handover.
	dpkg("-i /tmp/runnerd_" + pkgNextVersion + "_amd64.deb /tmp/controlplane_" + pkgNextVersion + "_amd64.deb")
	c.upgraded(e, firstPID, j1.ID)
	if got := strings.TrimSpace(c.sh("dpkg-query -W -f '${Version}\\n' runnerd controlplane")); got != pkgNextVersion+"\n"+pkgNextVersion {
		t.Errorf("installed versions %q, want %s", got, pkgNextVersion)
	}
	healthy("the upgraded control plane to answer /healthz")
	if c.sh("systemctl show -p MainPID --value controlplane") == cpPID {
		t.Errorf("the control plane's upgrade did not restart it")
	}
	if got := c.sh(fmt.Sprintf("runuser -u controlplane -- controlplane host list --server http://127.0.0.1:%d --data-dir /var/lib/controlplane", cpPort)); !strings.Contains(got, "packaged-host") {
		t.Errorf("the upgraded control plane lost its database: host list says\n%s", got)
	}
	e.release(conv.ID, "go-on")
	if j := e.waitEnded(j1.ID); j.State != wire.JobSucceeded || len(j.Attempts) != 1 || j.WorkerLostCount != 0 {
		t.Fatalf("the turn through the package upgrade: %s", describeJob(j))
	}
	prompt2 := "after the package upgrade"
	if j := e.waitEnded(e.send(conv.ID, prompt2).ID); j.State != wire.JobSucceeded {
		t.Fatalf("the turn after the package upgrade: %s", describeJob(j))
	}
	e.assertPromptsOnce(conv.ID, prompt1, prompt2)

	// A purge leaves nothing: no unit, no configuration, no state, and no
	// process of the host (its retained supervisor and agent included).
	dpkg("--purge runnerd controlplane")
	left := c.sh(`for f in /lib/systemd/system/runnerd.service /lib/systemd/system/controlplane.service /etc/runnerd /etc/controlplane /var/lib/controlplane /usr/bin/runnerd /usr/bin/controlplane; do [ -e $f ] && echo $f; done; ls -A /var/lib/runnerd 2>/dev/null; true`)
	if strings.TrimSpace(left) != "" {
		t.Errorf("the purge left:\n%s", left)
	}
	for _, p := range c.procs() {
		if strings.HasPrefix(p.cmdline, "/usr/bin/runnerd") || strings.HasPrefix(p.cmdline, "/usr/bin/controlplane") || strings.HasPrefix(p.cmdline, "/usr/local/bin/demoagent") {
			t.Errorf("the purge left process %d running: %s (%s)", p.pid, p.cmdline, p.cgroup)
		}
	}
}
