package runner

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"time"

	"github.com/runnerd/runnerd/handover"
	"github.com/runnerd/runnerd/heartbeat"
	"github.com/runnerd/runnerd/internal/boottime"
	"github.com/runnerd/runnerd/internal/failover"
	"github.com/runnerd/runnerd/internal/retry"
	"github.com/runnerd/runnerd/internal/tlsfiles"
	"github.com/runnerd/runnerd/runner/turn"
	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/wire"
)

// Defaults of Config's zero fields.
const (
	DefaultCapacity              = 2
	DefaultExecTimeout           = handover.DefaultExecutionTimeout // R5: 3,600 s
	DefaultExecTimeoutMargin     = 2 * time.Minute
	DefaultStopGrace             = handover.DefaultStopGrace
	DefaultKillGrace             = handover.DefaultKillGrace
	DefaultDrainTimeout          = 15 * time.Minute
	DefaultLaunchFailures        = 3
	DefaultLaunchBackoff         = 10 * time.Second
	DefaultLaunchBackoffMax      = 5 * time.Minute
	DefaultClaimWait             = 30 * time.Second
	DefaultClaimBackoff          = time.Second
	DefaultClaimBackoffMax       = time.Minute
	DefaultHostHeartbeatInterval = 10 * time.Second
	DefaultControlTimeout        = 30 * time.Second // R6
	DefaultJitter                = 0.2
	DefaultSandboxSweep          = time.Minute
	DefaultSandboxIdle           = 30 * time.Minute
)

// Config configures a Daemon. Zero fields mean the default; the first four
// are required. cmd/runnerd fills it from flags and the environment.
type Config struct {
	// ControlPlaneURL is the control plane's base address, or several
	// replicas' comma-separated, the preferred first (internal/failover):
	// calls go to one, move to the next on a transport failure or a 5xx,
	// and return to the preferred one when it answers again. Every turn
	// child gets the list.
	ControlPlaneURL string
	// HostToken authenticates claims and host heartbeats. Never logged.
	// Empty with a RegistrationToken: Run registers the host first.
	HostToken string
	// HostTokenFile is where the host token is kept: a registration
	// writes it there, and so does a rotation a heartbeat answer carries
	// (atomically, 0600). Empty: a rotated token is held in memory only.
	HostTokenFile string
	// RegistrationToken, used only while HostToken is empty, registers the
	// host under HostName with its operator Labels (POST /v1/agent/register)
	// before anything else. Never logged.
	RegistrationToken string
	// HostName names this host in records and in the turn payload.
	HostName string
	// BootID is the machine's kernel boot id, sent with the daemon's
	// instance id on host heartbeats and claims (wire.HeaderBootID): a
	// new instance with the live one's boot id is that machine's restart,
	// never refused host_token_in_use. Empty: read from
	// /proc/sys/kernel/random/boot_id (none sent where unreadable).
	BootID string
	// StateDir holds the persisted attempts (attempts/*.json, 0600) and is
	// handed to the sandbox backend through the turn payload.
	StateDir string

	// Capacity is how many turns run at once. Default 2.
	Capacity int
	// Sandbox is the backend name handed to the turn child: "process"
	// (default) or "docker"; Docker carries the docker backend's limits.
	Sandbox string
	Docker  turn.DockerOptions
	// Labels are the operator's routing labels (--label), sent with every
	// host heartbeat; the daemon adds the automatic ones, sandbox (the
	// backend), os and arch, which Labels may not set.
	Labels wire.Labels
	// Backend removes the sandbox of a conversation the control plane
	// reports LOST. Nil: nothing is removed (a record says so).
	Backend sandbox.Backend
	// SandboxSweep is the period of the sweep that removes the sandboxes of
	// LOST and unknown (deleted) conversations (sweep.go); the first runs
	// at start, after the restart decisions. Default 1 min; negative: no
	// sweep. It needs a Backend that can list its sandboxes.
	SandboxSweep time.Duration
	// SandboxIdle is how long a retained sandbox may go without a turn of
	// its conversation before the daemon stops it, keeping it (idle.go,
	// S1). Default 30 min; negative: never. It needs a Backend that can
	// list and stop its sandboxes (sandbox.Stopper).
	SandboxIdle time.Duration
	// TeardownBudget is how long an idle or pressure eviction's stop, or a
	// deletion's removal, has to prove the sandbox's processes gone (S6);
	// past it a sandbox_teardown_incomplete record names what survived.
	// The daemon's backend is built with it. Default
	// sandbox.DefaultTeardownBudget (15 s).
	TeardownBudget time.Duration
	// NoSpare keeps no spare turn child (spare.go): every claim starts its
	// child then. Default false: one spare waits.
	NoSpare bool
	// MinFreeDisk and MinFreeMemory are the host's floors of free disk (on
	// each of DiskPaths) and memory (MemAvailable of MemInfo): below
	// either, the daemon stops idle sandboxes, the longest idle first,
	// before it claims, and while still short takes no conversation's
	// first turn (pressure.go, S2). MinFreeDisk defaults to 10 %,
	// MinFreeMemory to off; FreeMinOff is off.
	MinFreeDisk   FreeMin
	MinFreeMemory FreeMin
	// DiskPaths are the filesystems measured for MinFreeDisk: default
	// StateDir (cmd/runnerd adds the Docker engine's root). MemInfo is the
	// meminfo file read for MinFreeMemory: default /proc/meminfo. Tests
	// point them at a small tmpfs and a file of their own.
	DiskPaths []string
	MemInfo   string

	// Timings are the lease renewal timings, already checked against R12
	// (heartbeat.ResolveTimings). Zero fields mean heartbeat's defaults.
	Timings heartbeat.Timings
	// Clock is what leases are counted on (R10, K5). Default
	// boottime.System, CLOCK_BOOTTIME, which the turn children and the
	// supervisors read too; a daemon in a testing/synctest bubble passes
	// boottime.Since(time.Now()), which runs on the bubble's fake time.
	// Deadlines handed to a child are converted to CLOCK_BOOTTIME.
	Clock boottime.Clock
	// NoBatchRequests sends every report on its own request. By default
	// the daemon batches them per host (internal/workerbatch; renewals
	// always go on their own, R14):
	// one sent at once while nothing is in flight, those made meanwhile
	// together in POST /v1/agent/worker/batch as soon as it returns; a
	// control plane without that path gets them one by one.
	NoBatchRequests bool
	// RenewHTTP configures the renewal client's transport (its request
	// timeout is Timings.RequestTimeout). Tests set DialContext.
	RenewHTTP heartbeat.HTTPConfig

	// ExecTimeout bounds the turn (R5), default 3,600 s, counted from the
	// launch of its child: the child gets the deadline in its payload and
	// enforces it in every phase (K6); the daemon, counting from the same
	// launch, stops a child still alive ExecTimeoutMargin later (default
	// 2 min), time for its report.
	ExecTimeout       time.Duration
	ExecTimeoutMargin time.Duration
	// StopGrace is STOP → SIGTERM of the child's group, KillGrace SIGTERM →
	// SIGKILL. Default 10 s each. The control plane's reaper grace must be
	// at least their sum (P3).
	StopGrace time.Duration
	KillGrace time.Duration
	// DrainTimeout bounds a drain: running turns may finish for this long,
	// then they are stopped. Default 15 min.
	DrainTimeout time.Duration

	// LaunchFailures is how many launch failures in a row pause claiming
	// (R37), default 3; the pause starts at LaunchBackoff (default 10 s)
	// and doubles up to LaunchBackoffMax (default 5 min).
	LaunchFailures   int
	LaunchBackoff    time.Duration
	LaunchBackoffMax time.Duration

	// ClaimWait is the long poll of one claim (default 30 s). A failed claim
	// is retried after ClaimBackoff (default 1 s), doubling up to
	// ClaimBackoffMax (default 1 min). Every wait carries ±Jitter.
	ClaimWait       time.Duration
	ClaimBackoff    time.Duration
	ClaimBackoffMax time.Duration
	// HostHeartbeatInterval is the period of the host heartbeat (default 10 s).
	HostHeartbeatInterval time.Duration
	// ControlTimeout bounds control requests other than renewals and
	// receipts (R6), default 30 s; a claim gets ClaimWait on top.
	ControlTimeout time.Duration
	// Jitter is the fraction by which polling and backoff waits vary
	// (default 0.2; negative means none).
	Jitter float64
	// Receipts paces the turn child's receipts: their TryTimeout and Wait
	// (settlement.ReceiptPolicy keeps the rest of R24).
	Receipts retry.Policy
	// PermissionTimeout bounds how long an ACP permission request under
	// the ask policy waits for the conversation's owner; 0: 10 min.
	PermissionTimeout time.Duration
	// Reports is the policy of the terminal reports the daemon sends —
	// finish, abandon, release — and of the restart's lease question
	// (settlement.ReportPolicy fills its zero fields, K1).
	Reports retry.Policy

	// Notifier receives READY=1, WATCHDOG=1 and STOPPING=1; nil means none.
	// WatchdogInterval is the period of WATCHDOG=1 (0: no watchdog).
	Notifier         Notifier
	WatchdogInterval time.Duration

	// Executable is the runnerd binary re-entered for each turn with
	// TurnArgs (default ["turn"]). Required.
	Executable string
	TurnArgs   []string
	// ChildEnv is the turn child's environment before handover filters it;
	// nil means the daemon's own.
	ChildEnv []string
	// ChildStderr receives the children's stderr (their records); nil
	// discards it.
	ChildStderr io.Writer
	// Scopes places each turn child, once it exists and before it has its
	// payload, where a stop of the daemon's service does not reach it: a
	// systemd scope of its own (cmd/runnerd under systemd). Nil leaves the
	// children in the daemon's own cgroup; ScopesOff then says why, for the
	// start record (runnerd_turn_scopes).
	Scopes    Scopes
	ScopesOff string
	// CgroupHierarchy names the host's cgroup hierarchy (unified, hybrid,
	// legacy) for the same record; empty leaves it out.
	CgroupHierarchy string
	// LogFormat ("json" or "text") is handed to the child for its records.
	LogFormat string
	// Version is reported in host heartbeats.
	Version string

	// TLS names the files of the control plane's TLS (--ca-file, the
	// client certificate of mTLS): the daemon's transports trust them, and
	// so does every turn child, which gets them in its payload. They are
	// read by New; an unreadable file is New's error.
	TLS tlsfiles.Client
	// Transport carries control requests (claims, host heartbeats,
	// reports); nil means a clone of http.DefaultTransport with TLS's
	// configuration.
	Transport http.RoundTripper
	// endpoints is ControlPlaneURL parsed; the daemon's transports share it.
	endpoints *failover.Endpoints
	// Logger receives the daemon's records; nil discards them.
	Logger *slog.Logger
	// Metrics receives the daemon's series; nil means unregistered ones.
	Metrics *Metrics
}

func (c Config) withDefaults() (Config, error) {
	var errs []error
	if c.Clock == nil {
		c.Clock = boottime.System{}
	}
	if c.BootID == "" {
		c.BootID = readBootID(bootIDFile)
	}
	if c.ControlPlaneURL == "" {
		errs = append(errs, errors.New("control plane URL is required"))
	} else if ep, err := failover.Parse(c.ControlPlaneURL); err != nil {
		errs = append(errs, fmt.Errorf("control plane URL %w", err))
	} else {
		c.endpoints = ep
	}
	if c.HostToken == "" && (c.RegistrationToken == "" || c.HostTokenFile == "") {
		errs = append(errs, errors.New("host token is required (or a registration token and a host token file to store the token it buys)"))
	}
	if c.HostName == "" {
		errs = append(errs, errors.New("host name is required"))
	}
	if c.StateDir == "" {
		errs = append(errs, errors.New("state directory is required"))
	}
	if c.Executable == "" {
		errs = append(errs, errors.New("runnerd executable path is required"))
	}
	if c.Capacity < 0 || c.LaunchFailures < 0 {
		errs = append(errs, errors.New("capacity and launch failure threshold must not be negative"))
	}
	switch c.Sandbox {
	case "":
		c.Sandbox = sandbox.BackendProcess
	case sandbox.BackendProcess, sandbox.BackendDocker:
	default:
		errs = append(errs, fmt.Errorf("sandbox %q: want %q or %q", c.Sandbox, sandbox.BackendProcess, sandbox.BackendDocker))
	}
	labels, err := hostLabels(c.Labels, c.Sandbox)
	if err != nil {
		errs = append(errs, err)
	}
	tlsConfig, err := c.TLS.Config()
	if err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return c, fmt.Errorf("runner config: %w", err)
	}
	c.Labels = labels
	setInt(&c.Capacity, DefaultCapacity)
	setInt(&c.LaunchFailures, DefaultLaunchFailures)
	setDur(&c.ExecTimeout, DefaultExecTimeout)
	setDur(&c.ExecTimeoutMargin, DefaultExecTimeoutMargin)
	setDur(&c.StopGrace, DefaultStopGrace)
	setDur(&c.KillGrace, DefaultKillGrace)
	setDur(&c.DrainTimeout, DefaultDrainTimeout)
	setDur(&c.LaunchBackoff, DefaultLaunchBackoff)
	setDur(&c.LaunchBackoffMax, DefaultLaunchBackoffMax)
	setDur(&c.ClaimWait, DefaultClaimWait)
	setDur(&c.ClaimBackoff, DefaultClaimBackoff)
	setDur(&c.ClaimBackoffMax, DefaultClaimBackoffMax)
	setDur(&c.HostHeartbeatInterval, DefaultHostHeartbeatInterval)
	setDur(&c.ControlTimeout, DefaultControlTimeout)
	setDur(&c.TeardownBudget, sandbox.DefaultTeardownBudget)
	if c.SandboxSweep == 0 {
		c.SandboxSweep = DefaultSandboxSweep
	}
	if c.SandboxIdle == 0 {
		c.SandboxIdle = DefaultSandboxIdle
	}
	if c.MinFreeDisk.zero() {
		c.MinFreeDisk = DefaultMinFreeDisk
	}
	if c.MinFreeMemory.zero() {
		c.MinFreeMemory = FreeMinOff
	}
	if len(c.DiskPaths) == 0 {
		c.DiskPaths = []string{c.StateDir}
	}
	if c.MemInfo == "" {
		c.MemInfo = DefaultMemInfo
	}
	c.LaunchBackoffMax = max(c.LaunchBackoffMax, c.LaunchBackoff)
	c.ClaimBackoffMax = max(c.ClaimBackoffMax, c.ClaimBackoff)
	switch {
	case c.Jitter == 0:
		c.Jitter = DefaultJitter
	case c.Jitter < 0:
		c.Jitter = 0
	case c.Jitter > 0.9:
		c.Jitter = 0.9
	}
	if c.Timings.LeaseTTL <= 0 {
		c.Timings.LeaseTTL = heartbeat.DefaultLeaseTTL
	}
	if c.Timings.Interval <= 0 {
		c.Timings.Interval = heartbeat.DefaultInterval
	}
	if c.Timings.RequestTimeout <= 0 {
		c.Timings.RequestTimeout = heartbeat.DefaultRequestTimeout
	}
	if c.Timings.RetryDelay <= 0 {
		c.Timings.RetryDelay = heartbeat.DefaultRetryDelay
	}
	if c.Timings.LeaseTTL < c.Timings.MinLeaseTTL() {
		return c, fmt.Errorf("runner config: lease %v is shorter than the renewal interval plus the request timeout (R12)", c.Timings.LeaseTTL)
	}
	if c.RenewHTTP.RequestTimeout <= 0 {
		c.RenewHTTP.RequestTimeout = c.Timings.RequestTimeout
	}
	if c.RenewHTTP.TLSClientConfig == nil && tlsConfig != nil {
		c.RenewHTTP.TLSClientConfig = tlsConfig.Clone()
	}
	if len(c.TurnArgs) == 0 {
		c.TurnArgs = []string{"turn"}
	}
	if c.ChildStderr == nil {
		c.ChildStderr = io.Discard
	}
	if c.Transport == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = tlsConfig
		c.Transport = tr
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics(nil)
	}
	return c, nil
}

func setDur(d *time.Duration, def time.Duration) {
	if *d <= 0 {
		*d = def
	}
}

func setInt(n *int, def int) {
	if *n <= 0 {
		*n = def
	}
}

// hostLabels are the labels a host heartbeat carries: the operator's, and
// the automatic sandbox, os and arch, which the operator may not set (a
// process host that said sandbox=docker would be given Docker turns).
func hostLabels(given wire.Labels, backend string) (wire.Labels, error) {
	l := wire.Labels{wire.LabelSandbox: backend, wire.LabelOS: runtime.GOOS, wire.LabelArch: runtime.GOARCH}
	for k, v := range given {
		if _, auto := l[k]; auto {
			return nil, fmt.Errorf("label %s is set by the daemon itself", k)
		}
		l[k] = v
	}
	if err := l.Check(); err != nil {
		return nil, fmt.Errorf("labels: %w", err)
	}
	return l, nil
}
