package runner

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/heartbeat"
	"github.com/runnerd/runnerd/internal/workerbatch"
	"github.com/runnerd/runnerd/wire"
)

// Daemon is the host daemon. New builds it; Run runs it until it is
// drained (Drain) or its turns are handed over to the next start (Run's
// context).
type Daemon struct {
	cfg      Config
	log      *slog.Logger
	rec      diagnostics.Recorder
	m        *Metrics
	state    stateDir
	gate     *launchGate
	health   *health
	control  *wire.Client // host-scoped calls, reports, releases
	renew    *wire.Client // renewals only: their own transport (R3)
	workerID string

	drainCtx     context.Context // done after Drain: claiming stops
	drain        context.CancelFunc
	stopTurns    chan struct{} // closed at the drain timeout or EndDrain: running turns are stopped
	endDrain     chan struct{} // closed by EndDrain
	endDrainOnce sync.Once
	handingOver  chan struct{} // closed once the handover began: accepted turns are left running
	handedOver   atomic.Int64  // turns left running for the next start at the handover
	kickBeat     chan struct{} // asks the host heartbeat to report now
	spare        spareState    // the turn child started before a claim (spare.go)
	kickSweep    chan struct{} // asks the sweep to ask (and report sandbox states) now
	pressure     *hostPressure // S2 (pressure.go)

	refused chan struct{} // closed when the host token was first refused
	// hostTok is the host token now: Config.HostToken, the one a
	// registration bought, or a rotated one a heartbeat answer carried.
	hostTok    atomic.Pointer[string]
	lastStatus string // the last STATUS= sent; only the host heartbeat loop touches it

	// mu guards the fields from here to cancelWatchMoved, and idle.
	mu          sync.Mutex
	busy        int // attempts held plus the slots of a claim in flight
	claiming    int // the slots the claim in flight reserved (counted in busy)
	hostRefused bool
	inUse       bool         // the last heartbeat or claim was refused host_token_in_use, no heartbeat accepted since (instance.go)
	beat        beatState    // the last host heartbeat's outcome (probes.go)
	backend     backendState // what the last probe of the sandbox backend said (probe.go)
	slotFreed   chan struct{}
	turnConvs   map[string]int // conversations with a turn held here (sweep.go)
	// idle holds the idle clocks of this host's sandboxes that no turn
	// holds (idle.go); nil when idle eviction is off.
	idle map[string]*sandboxIdle
	// cancelWatch holds the attempts the host's cancel poll asks about:
	// held here and not yet told of a cancel (cancels.go).
	cancelWatch      map[string]*attempt
	cancelWatchMoved chan struct{} // one pending notice that cancelWatch changed

	cluster *clusterPin // the control plane's identity, pinned at first contact (cluster.go)

	attempts sync.WaitGroup
}

// New checks cfg and builds a Daemon. It starts nothing.
func New(cfg Config) (*Daemon, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	st, err := openStateDir(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	// Claims, heartbeats, reports and renewals share one view of which
	// replica answers: a failure seen by one moves them all.
	// Under the endpoints, the control client's attempt-scoped calls
	// (reports) go in the host's batches (internal/workerbatch). Renewals
	// do not: each goes at once on its own pool (R3). Queued behind a
	// batch in flight, a renewal waited out that batch's round trip
	// before its own began, inside its own request timeout (R14): under
	// load (the chaos campaign at load 24) a host's renewals timed out
	// one after another and a lease was lost that per-call renewals kept.
	ep := cfg.endpoints
	var d *Daemon
	batched := func(base http.RoundTripper) http.RoundTripper {
		if cfg.NoBatchRequests {
			return base
		}
		return workerbatch.New(base, func() string { return d.hostToken() })
	}
	cfg.Transport = ep.Transport(batched(cfg.Transport))
	renewHTTP := heartbeat.NewHTTPClient(cfg.RenewHTTP)
	renewHTTP.Transport = countRenewals{base: ep.Transport(renewHTTP.Transport), m: cfg.Metrics}
	d = &Daemon{
		cfg:         cfg,
		log:         cfg.Logger,
		rec:         diagnostics.NewRecorder(cfg.Logger),
		m:           cfg.Metrics,
		state:       st,
		gate:        newLaunchGate(cfg.LaunchFailures, cfg.LaunchBackoff, cfg.LaunchBackoffMax, cfg.Jitter),
		health:      newHealth(),
		control:     &wire.Client{BaseURL: ep.Base(), HTTP: &http.Client{Transport: cfg.Transport}},
		renew:       &wire.Client{BaseURL: ep.Base(), HTTP: renewHTTP},
		workerID:    fmt.Sprintf("%s/%d", cfg.HostName, os.Getpid()),
		stopTurns:   make(chan struct{}),
		endDrain:    make(chan struct{}),
		handingOver: make(chan struct{}),
		kickBeat:    make(chan struct{}, 1),
		kickSweep:   make(chan struct{}, 1),
		pressure: &hostPressure{disks: cfg.DiskPaths, meminfo: cfg.MemInfo, minDisk: cfg.MinFreeDisk, minMem: cfg.MinFreeMemory,
			unmeasured: map[string]bool{}},
		slotFreed:        make(chan struct{}, 1),
		turnConvs:        map[string]int{},
		cancelWatch:      map[string]*attempt{},
		cancelWatchMoved: make(chan struct{}, 1),
		refused:          make(chan struct{}),
		cluster:          loadClusterPin(cfg.StateDir),
	}
	if _, ok := cfg.Backend.(sandboxStopper); ok && (cfg.SandboxIdle > 0 || d.pressure.on()) {
		d.idle = map[string]*sandboxIdle{} // idle clocks: idle eviction (S1), eviction under pressure (S2)
	}
	if _, ok := cfg.Backend.(backendProber); !ok {
		d.backend = backendReady // nothing to ask: the turn child's preflight decides
	}
	if ep.Len() > 1 {
		ep.OnSwitch(func(from, to string) {
			d.log.LogAttrs(context.Background(), slog.LevelWarn, MsgControlPlaneSwitched,
				slog.String("from", redactURL(from)), slog.String("to", redactURL(to)))
		})
	}
	d.hostTok.Store(&cfg.HostToken)
	d.control.Header = instanceHeader(rand.Text(), cfg.BootID)
	d.drainCtx, d.drain = context.WithCancel(context.Background())
	cfg.Metrics.daemon.CompareAndSwap(nil, d) // the first daemon of these metrics shows its state
	return d, nil
}

// Drain begins a drain, the way to take a host out of service: claiming
// stops, running turns go on with their leases renewed for up to
// Config.DrainTimeout, then they are stopped. Run returns once every turn
// has ended. Drain may be called many times; a stop (Run's context) during
// a drain hands over the turns still running.
func (d *Daemon) Drain() {
	if d.draining() {
		return
	}
	d.drain()
	select {
	case d.kickBeat <- struct{}{}:
	default:
	}
}

// EndDrain ends a drain at once, as its timeout would: the turns still
// running are stopped and reported. It begins the drain if none had begun.
func (d *Daemon) EndDrain() {
	d.Drain()
	d.endDrainOnce.Do(func() { close(d.endDrain) })
}

func (d *Daemon) draining() bool { return d.drainCtx.Err() != nil }

// Run resolves the persisted attempts of an earlier run (restart.go), then
// claims and runs turns until a drain has finished or ctx ends.
//
// The end of ctx is the handover (SIGTERM: a restart, an upgrade, a stop):
// claiming stops and Run returns within StopGrace, leaving every accepted
// turn running for the next start to re-attach (P5). Nothing is stopped and
// nothing more is sent for those turns: each one's state file, re-attach
// socket and lease stay as they are, its child keeps its agent going,
// fenced by its own lease deadline (K5), and waits on its socket. A launch
// in flight gets StopGrace to be answered (then it is handed over, or
// released on its decline as always); reports not yet acknowledged stay
// persisted, to be sent again by the next start (P2). Run returns with the
// handed-over turns' handover goroutines still reading their children's
// descriptors: the process's exit closes those, and that EOF after ACCEPT
// is what makes each child wait for the next daemon (the path a kill -9
// takes too; the child is told nothing else).
func (d *Daemon) Run(ctx context.Context) error {
	d.logStarted()
	d.logScopes()
	if d.hostToken() == "" {
		if err := d.register(ctx); err != nil {
			return err
		}
	}
	loops, stopLoops := context.WithCancel(context.Background())
	defer stopLoops()
	var wg sync.WaitGroup

	wg.Go(func() { d.hostBeatLoop(loops) })
	wg.Go(func() { d.cancelLoop(loops) })
	if p, ok := d.cfg.Backend.(backendProber); ok {
		wg.Go(func() { d.probeLoop(loops, p) })
	}
	if d.cfg.Notifier != nil && d.cfg.WatchdogInterval > 0 {
		wg.Go(func() { d.watchdogLoop(loops) })
	}

	// Recovery is bounded by one lease; the claim loop's health waits for it.
	d.health.expect(loopClaim, d.cfg.Timings.LeaseTTL+d.cfg.ControlTimeout+healthSlack)
	d.recoverAll(ctx)
	// After recovery, whose sweep of the state directory removes every
	// re-attach socket without a record (the spare's has none).
	d.refillSpare()
	defer d.closeSpare()
	if d.cfg.SandboxSweep > 0 {
		// After the restart decisions, so that their own removals come
		// first; stopped by a handover too, not only with the loops.
		sweepCtx, stopSweep := context.WithCancel(loops)
		defer stopSweep()
		defer context.AfterFunc(ctx, stopSweep)()
		wg.Go(func() { d.sweepLoop(sweepCtx) })
	}
	if st, ok := d.cfg.Backend.(sandboxStopper); ok && d.cfg.SandboxIdle > 0 {
		// After the restart decisions too: every re-attached turn is held.
		idleCtx, stopIdle := context.WithCancel(loops)
		defer stopIdle()
		defer context.AfterFunc(ctx, stopIdle)()
		wg.Go(func() { d.idleLoop(idleCtx, st) })
	}

	// The claim loop is the only one that starts attempts: once it has
	// returned, waiting for the attempts is safe.
	claimExited := make(chan struct{})
	wg.Go(func() {
		defer close(claimExited)
		d.claimLoop(ctx, loops)
		d.health.done(loopClaim) // stopped on purpose: not stuck
	})
	allDone := make(chan struct{})
	waitAttempts := func() {
		<-claimExited
		d.attempts.Wait()
		close(allDone)
	}
	go waitAttempts() // blocked until the claim loop returns (a drain cancels the long poll in flight)

	select {
	case <-d.drainCtx.Done():
		d.notify(notifyStopping)
		d.log.LogAttrs(context.Background(), slog.LevelInfo, MsgDrainStarted,
			slog.Int("running", d.running()), slog.Int64(diagnostics.KeyLimit, d.cfg.DrainTimeout.Milliseconds()))
		timer := time.NewTimer(d.cfg.DrainTimeout)
		select {
		case <-allDone:
		case <-timer.C:
			d.log.LogAttrs(context.Background(), slog.LevelWarn, MsgDrainTimeout, slog.Int("running", d.running()))
			close(d.stopTurns)
		case <-d.endDrain:
			d.log.LogAttrs(context.Background(), slog.LevelWarn, MsgDrainEnded, slog.Int("running", d.running()))
			close(d.stopTurns)
		case <-ctx.Done():
		}
		timer.Stop()
	case <-d.refused:
		// A refused host token ends the daemon as failed, once the turns
		// it runs (on their own worker tokens) have ended.
		d.notify(notifyStopping)
	case <-ctx.Done():
		d.notify(notifyStopping)
	}
	if ctx.Err() == nil {
		// Claiming stops in every case (a handover's ctx stops it without
		// a drain). Stopped turns end within StopGrace+KillGrace; a
		// handover (ctx, even now) does not wait for them.
		d.Drain()
		select {
		case <-allDone:
		case <-ctx.Done():
		}
	}
	handover := ctx.Err() != nil
	if handover {
		d.log.LogAttrs(context.Background(), slog.LevelInfo, MsgHandoverStarted, slog.Int(keyRunning, d.running()))
		close(d.handingOver)
		// Accepted turns are handed over at once; a launch in flight has
		// StopGrace to be answered.
		t := time.NewTimer(d.cfg.StopGrace)
		select {
		case <-allDone:
		case <-t.C:
		}
		t.Stop()
	}
	stopLoops()
	wg.Wait()
	if !handover && !d.isHostRefused() {
		// Admin → Servers shows the drained host with nothing running; the
		// host token is released for the next instance (instance.go).
		_ = d.sendHostBeat(context.Background(), true)
	}
	d.log.LogAttrs(context.Background(), slog.LevelInfo, MsgStopped, slog.Bool(keyHandover, handover),
		slog.Int64(keyHandedOver, d.handedOver.Load()), slog.Int(keyUnanswered, d.running()))
	if d.isHostRefused() {
		return ErrHostTokenRefused
	}
	return nil
}

// ErrHostTokenRefused is Run's error after the control plane refused the
// host token (401 or 403 on a claim or a host heartbeat): the host cannot
// work until it is registered again, so the daemon ends as failed.
var ErrHostTokenRefused = errors.New("the control plane refused the host token")

func (d *Daemon) logStarted() {
	c := d.cfg
	d.log.LogAttrs(context.Background(), slog.LevelInfo, MsgStarted,
		slog.String("version", c.Version),
		slog.String("control_plane", redactURLs(c.ControlPlaneURL)),
		slog.String("host_name", c.HostName),
		slog.String("state_dir", c.StateDir),
		slog.Int("capacity", c.Capacity),
		slog.Bool("spare_child", !c.NoSpare),
		slog.String("sandbox", c.Sandbox),
		slog.Int64("lease_ttl_ms", c.Timings.LeaseTTL.Milliseconds()),
		slog.Int64("renew_interval_ms", c.Timings.Interval.Milliseconds()),
		slog.Int64("renew_timeout_ms", c.Timings.RequestTimeout.Milliseconds()),
		slog.Int64("renew_retry_ms", c.Timings.RetryDelay.Milliseconds()),
		slog.Int64("exec_timeout_ms", c.ExecTimeout.Milliseconds()),
		slog.Int64("drain_timeout_ms", c.DrainTimeout.Milliseconds()),
		slog.Int64("stop_grace_ms", c.StopGrace.Milliseconds()),
		slog.Int64("kill_grace_ms", c.KillGrace.Milliseconds()),
		slog.Int("launch_failures", c.LaunchFailures),
		slog.Int64("claim_wait_ms", c.ClaimWait.Milliseconds()),
		slog.Int64("host_heartbeat_ms", c.HostHeartbeatInterval.Milliseconds()),
		slog.Int64("watchdog_ms", c.WatchdogInterval.Milliseconds()),
		slog.Int64("sandbox_sweep_ms", max(c.SandboxSweep, 0).Milliseconds()),
		slog.Int64("sandbox_idle_ms", max(c.SandboxIdle, 0).Milliseconds()),
		slog.String("min_free_disk", c.MinFreeDisk.String()),
		slog.String("min_free_memory", c.MinFreeMemory.String()),
		slog.String("disk_paths", strings.Join(c.DiskPaths, ",")),
		slog.Bool("notify", c.Notifier != nil),
		slog.Bool("tls_ca_file", c.TLS.CAFile != ""),
		slog.Bool("tls_client_cert", c.TLS.CertFile != ""),
	)
	for _, u := range strings.Split(c.ControlPlaneURL, ",") {
		if u = strings.TrimSpace(u); plainRemote(u) {
			// Host and worker tokens, prompts and answers cross the
			// network in the clear.
			d.log.LogAttrs(context.Background(), slog.LevelWarn, diagnostics.MsgControlPlanePlainHTTP,
				slog.String("control_plane", redactURL(u)))
		}
	}
}

// plainRemote reports whether raw is an http:// address of another host:
// anything but localhost or a loopback address.
func plainRemote(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "http" {
		return false
	}
	host := u.Hostname()
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return false
	}
	ip := net.ParseIP(host)
	return ip == nil || !ip.IsLoopback()
}

// ---- capacity ----

// takeSlots reserves the free slots, up to limit, for a claim of that
// many turns; 0 when all slots are busy.
func (d *Daemon) takeSlots(limit int) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := min(d.cfg.Capacity-d.busy, limit)
	if n <= 0 {
		return 0
	}
	d.busy += n
	d.claiming = n
	return n
}

// claimDone ends the claim in flight; kept is how many of its slots now
// hold an attempt (a replayed answer may hold more than were reserved:
// they are this host's turns all the same, and count).
func (d *Daemon) claimDone(kept int) {
	d.mu.Lock()
	d.busy += kept - d.claiming
	d.claiming = 0
	d.mu.Unlock()
}

// holdSlot counts an attempt resolved at start against capacity.
func (d *Daemon) holdSlot() {
	d.mu.Lock()
	d.busy++
	d.mu.Unlock()
}

func (d *Daemon) freeSlot() {
	d.mu.Lock()
	d.busy--
	d.mu.Unlock()
	select {
	case d.slotFreed <- struct{}{}:
	default:
	}
}

// running is how many attempts the daemon holds now.
func (d *Daemon) running() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.busy - d.claiming
}

// ---- host credential ----

// refuseHost stops claiming for good after the host token was refused;
// turns go on with their own worker tokens. One record, however often.
func (d *Daemon) refuseHost(op string, status int) {
	d.mu.Lock()
	first := !d.hostRefused
	d.hostRefused = true
	d.mu.Unlock()
	if first {
		close(d.refused)
		d.log.LogAttrs(context.Background(), slog.LevelError, MsgHostTokenRefused,
			slog.String(diagnostics.KeyOp, op), slog.Int(diagnostics.KeyStatus, status),
			slog.String(diagnostics.KeyClass, diagnostics.StatusClass(status)))
	}
}

// endpointMissing records, once per outage of op, that the control plane
// answered a host call 404: the server answers a host token it refuses with
// 401 or 403, so a 404 says that the configured address serves no such
// endpoint (a wrong path in --control-plane, a proxy in front of it) —
// not a verdict on the token. The call goes on being retried.
func (d *Daemon) endpointMissing(op string, status int) {
	if status != http.StatusNotFound {
		return
	}
	d.log.LogAttrs(context.Background(), slog.LevelError, MsgEndpointMissing,
		slog.String(diagnostics.KeyOp, op), slog.Int(diagnostics.KeyStatus, status))
}

func (d *Daemon) isHostRefused() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.hostRefused
}

// ---- systemd ----

func (d *Daemon) notify(state string) {
	if d.cfg.Notifier == nil {
		return
	}
	if err := d.cfg.Notifier.Notify(state); err != nil {
		d.log.LogAttrs(context.Background(), slog.LevelWarn, MsgNotifyFailed,
			slog.String("state", state), slog.String(diagnostics.KeyClass, diagnostics.Class(err)))
	}
}

// sleep waits dur unless stop closes first; false means stop closed.
func sleep(stop <-chan struct{}, dur time.Duration) bool {
	if dur <= 0 {
		select {
		case <-stop:
			return false
		default:
			return true
		}
	}
	t := time.NewTimer(dur)
	defer t.Stop()
	select {
	case <-stop:
		return false
	case <-t.C:
		return true
	}
}
