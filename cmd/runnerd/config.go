package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/peterbourgon/ff/v3"

	"github.com/runnerd/runnerd/heartbeat"
	"github.com/runnerd/runnerd/internal/failover"
	"github.com/runnerd/runnerd/runner"
	"github.com/runnerd/runnerd/runner/turn"
	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/docker"
	"github.com/runnerd/runnerd/settlement"
	"github.com/runnerd/runnerd/wire"
)

// envPrefix makes a flag's environment name (ff's rule): --renew-interval
// is RUNNERD_RENEW_INTERVAL.
const envPrefix = "RUNNERD"

// options is `runnerd run`'s configuration: the daemon's Config without what
// main builds (logger, notifier, backend, metrics, executable), and what
// only main uses.
type options struct {
	cfg       runner.Config
	tokenFile string
	// regFile is --registration-token-file: with it the host token lives
	// in tokenFile, STATE_DIR/host-token unless --host-token-file is
	// given, bought by a registration on the first start.
	regFile       string
	metricsListen string
	logFormat     string
	logLevel      string
	watchdog      time.Duration
	warnings      []heartbeat.Warning
	version       bool
}

// parseRun reads `runnerd run`'s flags from the command line, then from
// RUNNERD_ variables (the process environment, as ff reads it), then from
// --config, each for the flags the ones before left unset. getenv serves
// the variables that are not flags (R12's AGENT_LEASE_TTL). It returns
// one error that reads as one line.
func parseRun(args []string, getenv func(string) string) (options, error) {
	var o options
	c := &o.cfg
	fs := flag.NewFlagSet("runnerd run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	hostname, _ := os.Hostname()
	var (
		leaseTTL                       time.Duration
		interval, timeout, retry       time.Duration
		dockerCPUs                     float64
		dockerPids, dockerMemory       int64
		dockerLogBytes                 int64
		dockerLogFiles                 int
		receiptTimeout, receiptRetry   time.Duration
		launchBackoff, launchBackoffMx time.Duration
		sandboxSweep, sandboxIdle      time.Duration
		minFreeDisk, minFreeMemory     string
	)
	fs.StringVar(&c.ControlPlaneURL, "control-plane", "http://127.0.0.1:8080", "control plane base URL (https:// for TLS; http:// to another host is warned about at start), or several replicas' comma-separated, the preferred first: calls move to the next on a transport failure or a 5xx and come back when the preferred one answers")
	fs.StringVar(&c.TLS.CAFile, "ca-file", "", "PEM CA trusted beside the system's for an https:// control plane, by the daemon and every turn child")
	fs.StringVar(&c.TLS.CertFile, "tls-client-cert", "", "PEM client certificate shown to the control plane (its --client-ca: mTLS), beside --tls-client-key")
	fs.StringVar(&c.TLS.KeyFile, "tls-client-key", "", "PEM private key of --tls-client-cert (0600)")
	fs.StringVar(&o.tokenFile, "host-token-file", "/etc/runnerd/host-token", "file holding this host's token (0600); a rotated token is written here; with --registration-token-file default STATE_DIR/host-token")
	fs.StringVar(&o.regFile, "registration-token-file", "", "file holding a registration token (0600): on a first start with no host token file the daemon registers itself under --host-name with its --label set, stores its own host token (0600) and uses only that from then on")
	fs.StringVar(&c.HostName, "host-name", hostname, "this host's name, as registered with the control plane")
	fs.StringVar(&c.StateDir, "state-dir", "/var/lib/runnerd", "state directory (persisted attempts, sandboxes)")
	fs.IntVar(&c.Capacity, "capacity", runner.DefaultCapacity, "turns run at once")
	batch := fs.Bool("batch-requests", true, "send the reports of this host's turns made while one is in flight together in the next POST /v1/agent/worker/batch (never on a timer: one made while none is in flight goes at once); a control plane without that path gets them one by one; false: each on its own request")
	spare := fs.Bool("spare-child", true, "keep one turn child started and waiting for the next claim (no slot of --capacity): claim → ACCEPT without a process start")
	fs.StringVar(&c.Sandbox, "sandbox", sandbox.BackendProcess, "sandbox backend: process or docker")
	c.Labels = wire.Labels{}
	fs.Var(labelsFlag(c.Labels), "label", "routing label key=value, repeatable or comma-separated (RUNNERD_LABEL=a=1,b=2); sandbox, os and arch are set automatically")
	fs.DurationVar(&leaseTTL, "lease-ttl", heartbeat.DefaultLeaseTTL, "attempt lease; at least renew-interval + renew-timeout (R12)")
	fs.DurationVar(&interval, "renew-interval", heartbeat.DefaultInterval, "lease renewal interval")
	fs.DurationVar(&timeout, "renew-timeout", heartbeat.DefaultRequestTimeout, "lease renewal request timeout")
	fs.DurationVar(&retry, "renew-retry", heartbeat.DefaultRetryDelay, "delay before retrying a failed renewal")
	fs.DurationVar(&c.ExecTimeout, "exec-timeout", runner.DefaultExecTimeout, "agent turn execution timeout (R5)")
	fs.DurationVar(&c.ExecTimeoutMargin, "exec-timeout-margin", runner.DefaultExecTimeoutMargin, "time past exec-timeout before the daemon stops a turn child itself")
	fs.DurationVar(&c.DrainTimeout, "drain-timeout", runner.DefaultDrainTimeout, "how long running turns may finish during a drain (runnerd drain)")
	fs.DurationVar(&c.StopGrace, "stop-grace", runner.DefaultStopGrace, "STOP frame to SIGTERM of a turn's process group")
	fs.DurationVar(&c.KillGrace, "kill-grace", runner.DefaultKillGrace, "SIGTERM to SIGKILL of a turn's process group")
	fs.IntVar(&c.LaunchFailures, "launch-failures", runner.DefaultLaunchFailures, "launch failures in a row that pause claiming (R37)")
	fs.DurationVar(&launchBackoff, "launch-backoff", runner.DefaultLaunchBackoff, "first claiming pause after launch failures")
	fs.DurationVar(&launchBackoffMx, "launch-backoff-max", runner.DefaultLaunchBackoffMax, "longest claiming pause after launch failures")
	fs.DurationVar(&c.ClaimWait, "claim-wait", runner.DefaultClaimWait, "long poll of one claim")
	fs.DurationVar(&c.ClaimBackoff, "claim-backoff", runner.DefaultClaimBackoff, "first wait after a failed claim")
	fs.DurationVar(&c.ClaimBackoffMax, "claim-backoff-max", runner.DefaultClaimBackoffMax, "longest wait after failed claims")
	fs.DurationVar(&c.HostHeartbeatInterval, "host-heartbeat-interval", runner.DefaultHostHeartbeatInterval, "host heartbeat period")
	fs.DurationVar(&c.TeardownBudget, "teardown-budget", sandbox.DefaultTeardownBudget, "how long an eviction's stop or a deletion's removal has to prove the sandbox's processes gone, else a sandbox_teardown_incomplete record names what survived (S6)")
	fs.DurationVar(&sandboxSweep, "sandbox-sweep", runner.DefaultSandboxSweep, "period of the sweep that removes LOST and deleted conversations' sandboxes (0: off)")
	fs.DurationVar(&sandboxIdle, "sandbox-idle", runner.DefaultSandboxIdle, "stop (not delete) a conversation's sandbox after this long without a turn; the next message starts it again (0: never)")
	fs.StringVar(&minFreeDisk, "min-free-disk", runner.DefaultMinFreeDisk.String(), "below this free disk (N% of the filesystem, or bytes: 20GiB) on the state directory's or Docker's filesystem, stop idle sandboxes and then withhold new conversations' first turns (S2); 0: off")
	fs.StringVar(&minFreeMemory, "min-free-memory", "0", "below this free memory (MemAvailable; N% or bytes: 2GiB), stop idle sandboxes and then withhold new conversations' first turns (S2); 0: off")
	fs.DurationVar(&c.ControlTimeout, "control-timeout", runner.DefaultControlTimeout, "timeout of other control requests (R6)")
	fs.DurationVar(&receiptTimeout, "receipt-timeout", settlement.DefaultTryTimeout, "timeout of each receipt or report try (R24)")
	fs.DurationVar(&receiptRetry, "receipt-retry", settlement.DefaultWait, "pause between receipt or report tries (R24)")
	fs.DurationVar(&c.PermissionTimeout, "permission-timeout", 10*time.Minute, "how long an ACP permission request under the ask policy waits for the owner's answer before it is answered cancelled")
	fs.DurationVar(&o.watchdog, "watchdog-interval", 10*time.Second, "WATCHDOG=1 period when systemd sets no WATCHDOG_USEC")
	fs.StringVar(&o.metricsListen, "listen-metrics", "", "address for /metrics, /healthz (the daemon's loops check in) and /readyz (control plane reachable, claiming enabled); empty: off")
	var metricsListenOld string
	fs.StringVar(&metricsListenOld, "metrics-listen", "", "the older name of --listen-metrics")
	fs.StringVar(&o.logFormat, "log-format", "json", "records as json (journald) or text (people)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.Docker.Pull, "pull", docker.PullMissing, "docker backend: pull a conversation's image to create its container: never, missing (when not on this host) or always")
	fs.StringVar(&c.Docker.Network, "docker-network", "none", "docker backend: container network")
	fs.Int64Var(&dockerPids, "docker-pids", 256, "docker backend: process limit per container (negative: none)")
	fs.Int64Var(&dockerMemory, "docker-memory", 2<<30, "docker backend: memory limit in bytes (negative: none)")
	fs.Float64Var(&dockerCPUs, "docker-cpus", 1, "docker backend: CPUs per container (negative: none)")
	fs.Int64Var(&dockerLogBytes, "docker-log-max-size", docker.DefaultLogMaxBytes, "docker backend: bytes per container log file, json-file driver (negative: the engine's own log configuration)")
	fs.IntVar(&dockerLogFiles, "docker-log-max-files", docker.DefaultLogMaxFiles, "docker backend: container log files kept")
	fs.BoolVar(&o.version, "version", false, "print the version and exit")

	fs.String("config", "", "file of settings, one \"flag value\" per line (# starts a comment); flags and RUNNERD_ variables win over it")

	// One definition, three sources: the command line, then RUNNERD_
	// variables, then --config (ff).
	err := ff.Parse(fs, args, ff.WithEnvVarPrefix(envPrefix), ff.WithConfigFileFlag("config"), ff.WithConfigFileParser(ff.PlainParser))
	if o.version {
		return o, nil // --version answers whatever else is wrong
	}
	if errors.Is(err, flag.ErrHelp) {
		var b strings.Builder
		b.WriteString("usage: runnerd run [flags]; every flag has a RUNNERD_ variable (--renew-interval: RUNNERD_RENEW_INTERVAL)\nand may be set in --config FILE\n\n")
		fs.SetOutput(&b)
		fs.PrintDefaults()
		return o, &helpError{usage: b.String()}
	}
	if err != nil {
		if m := ffEnvError.FindStringSubmatch(err.Error()); m != nil {
			return o, fmt.Errorf("%s=%q is not a valid --%s", m[2], os.Getenv(m[2]), m[1])
		}
		return o, oneLine(err)
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	given := map[string]bool{} // set by any of the three sources
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if given["metrics-listen"] {
		if given["listen-metrics"] && o.metricsListen != metricsListenOld {
			return o, fmt.Errorf("--listen-metrics %q and its older name --metrics-listen %q disagree: give one", o.metricsListen, metricsListenOld)
		}
		o.metricsListen = metricsListenOld
	}

	// Every duration flag must be positive: a zero here was given on
	// purpose, not left for a default.
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"renew-interval", interval}, {"renew-timeout", timeout}, {"renew-retry", retry},
		{"exec-timeout", c.ExecTimeout}, {"exec-timeout-margin", c.ExecTimeoutMargin}, {"drain-timeout", c.DrainTimeout},
		{"stop-grace", c.StopGrace}, {"kill-grace", c.KillGrace}, {"launch-backoff", launchBackoff},
		{"launch-backoff-max", launchBackoffMx}, {"claim-wait", c.ClaimWait}, {"claim-backoff", c.ClaimBackoff},
		{"claim-backoff-max", c.ClaimBackoffMax}, {"host-heartbeat-interval", c.HostHeartbeatInterval},
		{"control-timeout", c.ControlTimeout}, {"receipt-timeout", receiptTimeout}, {"receipt-retry", receiptRetry},
		{"watchdog-interval", o.watchdog}, {"permission-timeout", c.PermissionTimeout}, {"teardown-budget", c.TeardownBudget},
	} {
		if d.v <= 0 {
			return o, fmt.Errorf("--%s %v: must be positive", d.name, d.v)
		}
	}
	// R12 and the renewal timings: heartbeat checks them together and its
	// errors name these flags.
	if o.regFile != "" && !given["host-token-file"] {
		o.tokenFile = filepath.Join(c.StateDir, "host-token")
	}
	leaseSet := given["lease-ttl"]
	t, warns, err := heartbeat.ResolveTimings(heartbeat.TimingInputs{
		LeaseTTLFlag:    leaseTTL,
		LeaseTTLFlagSet: leaseSet,
		LeaseTTLEnv:     getenv(heartbeat.EnvLeaseTTL),
		Interval:        interval,
		RequestTimeout:  timeout,
		RetryDelay:      retry,
	})
	if err != nil {
		return o, err
	}
	c.Timings, o.warnings = t, warns

	switch {
	case c.ControlPlaneURL == "":
		return o, errors.New("--control-plane is required")
	case c.HostName == "":
		return o, errors.New("--host-name is required (the host name could not be read)")
	case c.StateDir == "":
		return o, errors.New("--state-dir is required")
	case o.tokenFile == "":
		return o, errors.New("--host-token-file is required")
	case c.Capacity < 1:
		return o, fmt.Errorf("--capacity %d: must be at least 1", c.Capacity)
	case c.Docker.Pull != docker.PullNever && c.Docker.Pull != docker.PullMissing && c.Docker.Pull != docker.PullAlways:
		return o, fmt.Errorf("--pull %q: want %s, %s or %s", c.Docker.Pull, docker.PullNever, docker.PullMissing, docker.PullAlways)
	case c.LaunchFailures < 1:
		return o, fmt.Errorf("--launch-failures %d: must be at least 1", c.LaunchFailures)
	case launchBackoffMx < launchBackoff:
		return o, fmt.Errorf("--launch-backoff-max %v is shorter than --launch-backoff %v", launchBackoffMx, launchBackoff)
	case sandboxSweep < 0:
		return o, fmt.Errorf("--sandbox-sweep %v: must not be negative (0 turns the sweep off)", sandboxSweep)
	case sandboxIdle < 0:
		return o, fmt.Errorf("--sandbox-idle %v: must not be negative (0 never stops an idle sandbox)", sandboxIdle)
	case c.ClaimBackoffMax < c.ClaimBackoff:
		return o, fmt.Errorf("--claim-backoff-max %v is shorter than --claim-backoff %v", c.ClaimBackoffMax, c.ClaimBackoff)
	case c.Sandbox != sandbox.BackendProcess && c.Sandbox != sandbox.BackendDocker:
		return o, fmt.Errorf("--sandbox %q: want process or docker", c.Sandbox)
	case dockerLogBytes == 0:
		return o, errors.New("--docker-log-max-size 0: want a size in bytes (negative: the engine's own log configuration)")
	case dockerLogFiles < 1:
		return o, fmt.Errorf("--docker-log-max-files %d: must be at least 1", dockerLogFiles)
	case o.logFormat != "json" && o.logFormat != "text":
		return o, fmt.Errorf("--log-format %q: want json or text", o.logFormat)
	}
	if _, err := parseLevel(o.logLevel); err != nil {
		return o, err
	}
	if _, err := failover.Parse(c.ControlPlaneURL); err != nil {
		return o, fmt.Errorf("--control-plane %w", err)
	}
	if _, err := c.TLS.Config(); err != nil {
		return o, err // half a pair, an unreadable or spoilt file: named with its flag
	}
	for _, auto := range []string{wire.LabelSandbox, wire.LabelOS, wire.LabelArch} {
		if v, ok := c.Labels[auto]; ok {
			return o, fmt.Errorf("--label %s=%s: %s is set by the daemon itself", auto, v, auto)
		}
	}
	c.LaunchBackoff, c.LaunchBackoffMax = launchBackoff, launchBackoffMx
	c.SandboxSweep = sandboxSweep
	if sandboxSweep == 0 {
		c.SandboxSweep = -1 // runner.Config: zero is the default, negative is off
	}
	c.NoSpare = !*spare
	c.NoBatchRequests = !*batch
	c.SandboxIdle = sandboxIdle
	if sandboxIdle == 0 {
		c.SandboxIdle = -1 // runner.Config: zero is the default, negative is never
	}
	if c.MinFreeDisk, err = runner.ParseFreeMin(minFreeDisk); err != nil {
		return o, fmt.Errorf("--min-free-disk %w", err)
	}
	if c.MinFreeMemory, err = runner.ParseFreeMin(minFreeMemory); err != nil {
		return o, fmt.Errorf("--min-free-memory %w", err)
	}
	c.Receipts.TryTimeout, c.Receipts.Wait = receiptTimeout, receiptRetry
	c.Reports.TryTimeout, c.Reports.Wait = receiptTimeout, receiptRetry
	c.LogFormat = o.logFormat
	c.Docker = turn.DockerOptions{
		Pull:        c.Docker.Pull,
		Network:     c.Docker.Network,
		PidsLimit:   dockerPids,
		MemoryBytes: dockerMemory,
		NanoCPUs:    int64(dockerCPUs * 1e9),
		LogMaxBytes: dockerLogBytes,
		LogMaxFiles: dockerLogFiles,
	}
	if dockerCPUs < 0 {
		c.Docker.NanoCPUs = -1
	}
	return o, nil
}

// labelsFlag is --label: each value is one or more key=value pairs,
// comma-separated, so that the one RUNNERD_LABEL variable can hold
// several; a repeated key must keep its value.
type labelsFlag wire.Labels

func (l labelsFlag) String() string { return wire.Labels(l).String() }

func (l labelsFlag) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok {
			return fmt.Errorf("%q is not key=value", p)
		}
		if old, dup := l[k]; dup && old != val {
			return fmt.Errorf("label %s given twice (%s and %s)", k, old, val)
		}
		l[k] = val
	}
	return wire.Labels(l).Check()
}

// ffEnvError is ff's error for a variable that is not a valid value of
// its flag; it names both but not the value.
var ffEnvError = regexp.MustCompile(`setting flag "([^"]+)" from environment variable "([^"]+)"`)

// oneLine keeps the first line of a parse error ("invalid value … for
// flag -x: …", without ff's "error parsing …: " preamble) and drops the
// flag package's usage text.
func oneLine(err error) error {
	s, _, _ := strings.Cut(err.Error(), "\n")
	for _, p := range []string{"error parsing commandline arguments: ", "error parsing environment variables: "} {
		s = strings.TrimPrefix(s, p)
	}
	return errors.New(s)
}

// helpError is -h or --help: the usage goes to stdout, and the exit is 0.
type helpError struct{ usage string }

func (e *helpError) Error() string { return "help requested" }
