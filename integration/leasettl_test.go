package integration

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// TestLeaseTTLShorterThanIntervalPlusTimeout holds R12 at the binary's
// edge. A --lease-ttl shorter than one renewal interval plus one request
// timeout is refused at start-up with one clear line and a non-zero exit.
// The same value in AGENT_LEASE_TTL is ignored with an
// agent_config_ignored record, and the daemon claims with the default
// 120 s lease instead.
func TestLeaseTTLShorterThanIntervalPlusTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	short := (renewEvery + renewTimeout - 50*time.Millisecond).String()

	cfg := e.daemonConfig()
	cfg.LeaseTTL = 0
	args := append(cfg.Args, "--lease-ttl", short)
	cmd := exec.CommandContext(e.ctx, cfg.Bin, append([]string{"run",
		"--control-plane", cfg.ControlPlaneURL, "--host-token-file", cfg.HostTokenFile, "--host-name", cfg.HostName,
		"--state-dir", cfg.StateDir, "--renew-interval", renewEvery.String(), "--renew-timeout", renewTimeout.String(),
		"--renew-retry", renewRetry.String()}, args...)...)
	out, err := cmd.CombinedOutput()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err == nil || cmd.ProcessState.ExitCode() == 0 {
		t.Fatalf("runnerd run --lease-ttl %s started: %s", short, out)
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "lease") {
		t.Errorf("want one line naming the lease, got:\n%s", out)
	}

	d := e.startDaemon(func(c *fleet.DaemonConfig) {
		c.LeaseTTL = 0
		c.Env = append(c.Env, "AGENT_LEASE_TTL="+short)
	})
	conv := e.conversation("default lease")
	j := e.waitEnded(e.send(conv.ID, "hello").ID)
	if j.State != wire.JobSucceeded || len(j.Attempts) != 1 {
		t.Fatalf("turn: %s", describeJob(j))
	}
	claimed, ok := findEvent(j, j.Attempts[0].ID, "claimed")
	if !ok || !strings.Contains(string(claimed.Data), "lease_expires_at") {
		t.Fatalf("no claimed event: %s", describeJob(j))
	}
	if lease := j.Attempts[0].LeaseExpiresAt.Sub(j.Attempts[0].ClaimedAt); lease < 100*time.Second {
		t.Errorf("the daemon claimed with a %v lease; AGENT_LEASE_TTL=%s should have been ignored for the 120 s default", lease, short)
	}
	if out := d.Output(); !strings.Contains(out, `"msg":"agent_config_ignored"`) || !strings.Contains(out, `"AGENT_LEASE_TTL"`) {
		t.Errorf("no agent_config_ignored record for AGENT_LEASE_TTL in the daemon's output")
	}
}
