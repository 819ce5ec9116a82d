package fleet

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"time"
)

// DaemonConfig configures `runnerd run`. Zero fields leave the daemon's
// defaults.
type DaemonConfig struct {
	Bin             string // the runnerd executable; required
	ControlPlaneURL string // required
	HostTokenFile   string // required
	HostName        string // required
	StateDir        string // required
	Capacity        int
	Sandbox         string // process (default) or docker

	LeaseTTL         time.Duration
	RenewInterval    time.Duration
	RenewTimeout     time.Duration
	RenewRetry       time.Duration
	ReceiptTimeout   time.Duration
	ReceiptRetry     time.Duration
	ExecTimeout      time.Duration
	DrainTimeout     time.Duration
	StopGrace        time.Duration
	KillGrace        time.Duration
	LaunchFailures   int
	LaunchBackoff    time.Duration
	LaunchBackoffMax time.Duration
	ClaimWait        time.Duration
	ClaimBackoff     time.Duration
	ClaimBackoffMax  time.Duration
	ControlTimeout   time.Duration
	HostHeartbeat    time.Duration

	// Wrap is run before Bin, as in ip netns exec NS: it must exec Bin
	// in its own process, so that the pid stays the daemon's.
	Wrap []string
	// Args are appended to the command line; Env to the environment.
	Args []string
	Env  []string
	// Log receives the daemon's records (JSON lines) and its children's.
	Log io.Writer
}

// Daemon is a running `runnerd run`.
type Daemon struct {
	*Process
	Config DaemonConfig
	out    *lineWatch
}

// args is the command line of cfg after the executable.
func (cfg DaemonConfig) args() []string {
	args := []string{"run",
		"--control-plane", cfg.ControlPlaneURL,
		"--host-token-file", cfg.HostTokenFile,
		"--host-name", cfg.HostName,
		"--state-dir", cfg.StateDir,
		"--log-format", "json",
	}
	if cfg.Capacity > 0 {
		args = append(args, "--capacity", strconv.Itoa(cfg.Capacity))
	}
	if cfg.Sandbox != "" {
		args = append(args, "--sandbox", cfg.Sandbox)
	}
	args = appendDur(args, "--lease-ttl", cfg.LeaseTTL)
	args = appendDur(args, "--renew-interval", cfg.RenewInterval)
	args = appendDur(args, "--renew-timeout", cfg.RenewTimeout)
	args = appendDur(args, "--renew-retry", cfg.RenewRetry)
	args = appendDur(args, "--receipt-timeout", cfg.ReceiptTimeout)
	args = appendDur(args, "--receipt-retry", cfg.ReceiptRetry)
	args = appendDur(args, "--exec-timeout", cfg.ExecTimeout)
	args = appendDur(args, "--drain-timeout", cfg.DrainTimeout)
	args = appendDur(args, "--stop-grace", cfg.StopGrace)
	args = appendDur(args, "--kill-grace", cfg.KillGrace)
	if cfg.LaunchFailures > 0 {
		args = append(args, "--launch-failures", strconv.Itoa(cfg.LaunchFailures))
	}
	args = appendDur(args, "--launch-backoff", cfg.LaunchBackoff)
	args = appendDur(args, "--launch-backoff-max", cfg.LaunchBackoffMax)
	args = appendDur(args, "--claim-wait", cfg.ClaimWait)
	args = appendDur(args, "--claim-backoff", cfg.ClaimBackoff)
	args = appendDur(args, "--claim-backoff-max", cfg.ClaimBackoffMax)
	args = appendDur(args, "--control-timeout", cfg.ControlTimeout)
	args = appendDur(args, "--host-heartbeat-interval", cfg.HostHeartbeat)
	return append(args, cfg.Args...)
}

// StartDaemon starts the daemon. It does not wait for anything: poll the
// control plane (Admin → Servers) to see it up.
func StartDaemon(ctx context.Context, cfg DaemonConfig) (*Daemon, error) {
	cmd := wrapped(cfg.Wrap, cfg.Bin, cfg.args())
	cmd.Env = cleanEnv(cfg.Env)
	p, out, err := startWatched("runnerd", cmd, cfg.Log)
	if err != nil {
		return nil, err
	}
	return &Daemon{Process: p, Config: cfg, out: out}, nil
}

// Output is what the daemon (and its turn children) wrote so far.
func (d *Daemon) Output() string { return d.out.text() }

// Mark names the present end of the daemon's output, for AwaitOutput.
func (d *Daemon) Mark() int { return d.out.mark() }

// AwaitOutput waits up to timeout for a line of the daemon's output (its
// records, and its turn children's) after mark that matches re.
func (d *Daemon) AwaitOutput(mark int, re *regexp.Regexp, timeout time.Duration) ([]string, error) {
	return d.out.await(mark, re, timeout)
}

// Restart starts a new daemon with the same configuration, after this one
// has exited.
func (d *Daemon) Restart(ctx context.Context) (*Daemon, error) {
	select {
	case <-d.Done():
	default:
		return nil, fmt.Errorf("restart: pid %d is still running", d.Pid())
	}
	return StartDaemon(ctx, d.Config)
}
