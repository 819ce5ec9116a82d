// Package held measures what a host pays per held turn: it
// starts the reference control plane on SQLite and one `runnerd run` with
// the process backend and the demo agent from built binaries (package
// fleet), enqueues N turns whose agent stays silent, waits until all N are
// held and their leases renewed, reads /proc for the daemon and for the
// whole host the daemon makes (turn children, supervisors, agents), then
// cancels every turn and checks that nothing stayed behind.
//
// It is a measurement, not a test: nothing here asserts a figure. Run it
// with `go run ./internal/bench/held/cmd` or through `make bench`; only
// commands and benchmark harnesses import it. It imports internal/fleet
// and wire.
package held

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// Config says what to measure. Zero fields mean the defaults.
type Config struct {
	// Bin is the directory of the built runnerd, controlplane and demoagent
	// (`make build` leaves them in bin/); required.
	Bin string
	// Turns is how many silent turns to hold at once. Default 100.
	Turns int
	// Window is how long CPU is counted while every turn is held. Default 60 s.
	Window time.Duration
	// RenewInterval is the daemon's --renew-interval; default the product's
	// (30 s), so that CPU per turn is what a real host pays.
	RenewInterval time.Duration
	// Dir holds the database, state directory and logs; default a new
	// temporary directory, removed afterwards unless Keep.
	Dir  string
	Keep bool
	// DaemonEnv is added to the daemon's environment (GODEBUG, GOMAXPROCS…),
	// which its turn children and supervisors inherit.
	DaemonEnv []string
	// Progress receives one line per phase; nil discards them.
	Progress io.Writer
	// Timeout bounds the whole run; default 10 min + 1 s per turn.
	Timeout time.Duration
}

// Result is one run's figures. Usage.CPUTicks are ticks (1/100 s) spent
// during the window, every other field is read at its end.
type Result struct {
	Turns  int           `json:"turns"`
	Window time.Duration `json:"window_ns"`
	// Idle is the daemon before any turn, Daemon with every turn held.
	Idle   Usage `json:"idle"`
	Daemon Usage `json:"daemon"`
	// Host is everything the daemon makes: itself, turn children,
	// supervisors, agents; Roles splits it by role (the Role* constants).
	Host  Usage            `json:"host"`
	Roles map[string]Usage `json:"roles"`
	// Goroutines of the daemon (its go_goroutines metric): idle, held, after.
	IdleGoroutines  int `json:"idle_goroutines"`
	HeldGoroutines  int `json:"held_goroutines"`
	AfterGoroutines int `json:"after_goroutines"`
	// After is the daemon once every turn has ended.
	After Usage `json:"after"`
	// LoadAvg is /proc/loadavg at the end of the window.
	LoadAvg [3]float64 `json:"load_avg"`
	// Hold is how long it took from the first message to all turns held
	// and renewed; Outcomes counts how the cancelled turns ended.
	Hold     time.Duration  `json:"hold_ns"`
	Outcomes map[string]int `json:"outcomes"`
	// Leaks lists what stayed behind after the turns ended: turn children
	// or agents alive, attempt records left, goroutines or descriptors
	// above the idle daemon's. Empty means none.
	Leaks []string `json:"leaks"`
	// NoFile is the RLIMIT_NOFILE the run had.
	NoFile uint64 `json:"nofile"`
}

// DaemonThreadsPerTurn is the daemon's threads above idle, per turn.
func (r Result) DaemonThreadsPerTurn() float64 {
	return float64(r.Daemon.Threads-r.Idle.Threads) / float64(r.Turns)
}

// DaemonKBPerTurn is the daemon's resident memory above idle, per turn.
func (r Result) DaemonKBPerTurn() float64 {
	return float64(r.Daemon.RSSKB-r.Idle.RSSKB) / float64(r.Turns)
}

// CPUMsPerTurnMinute is CPU per held turn per minute of u's window.
func (r Result) CPUMsPerTurnMinute(u Usage) float64 {
	ms := float64(u.CPUTicks) * 1000 / userHZ
	return ms / float64(r.Turns) / r.Window.Minutes()
}

// WriteTable writes the figures as a plain table.
func (r Result) WriteTable(w io.Writer) error {
	n := float64(r.Turns)
	fmt.Fprintf(w, "%d held turns, CPU over %v, load average %.2f %.2f %.2f\n", r.Turns, r.Window, r.LoadAvg[0], r.LoadAvg[1], r.LoadAvg[2])
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\tprocesses\tthreads\tRSS MB\tPSS MB\tfds (tcp)\tCPU ms/turn/min\t")
	row := func(name string, u Usage, cpu bool) {
		c := "-"
		if cpu {
			c = fmt.Sprintf("%.2f", r.CPUMsPerTurnMinute(u))
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%.1f\t%d (%d)\t%s\t\n", name, u.Processes, u.Threads, float64(u.RSSKB)/1024, float64(u.PSSKB)/1024, u.FDs, u.TCP, c)
	}
	row("daemon idle", r.Idle, false)
	row("daemon held", r.Daemon, true)
	roles := make([]string, 0, len(r.Roles))
	for k := range r.Roles {
		roles = append(roles, k)
	}
	sort.Strings(roles)
	for _, k := range roles {
		if k != RoleDaemon {
			row(k, r.Roles[k], true)
		}
	}
	row("host total", r.Host, true)
	row("daemon after", r.After, false)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "per held turn: daemon %.2f threads, %.1f KB RSS; host %.2f processes, %.1f threads, %.0f KB PSS, %.0f KB RSS\n",
		r.DaemonThreadsPerTurn(), r.DaemonKBPerTurn(), float64(r.Host.Processes)/n, float64(r.Host.Threads)/n,
		float64(r.Host.PSSKB)/n, float64(r.Host.RSSKB)/n)
	fmt.Fprintf(w, "daemon goroutines: idle %d, held %d, after %d; all held and renewed %v after the first message\n",
		r.IdleGoroutines, r.HeldGoroutines, r.AfterGoroutines, r.Hold.Round(time.Second))
	fmt.Fprintf(w, "outcomes: %v; leaks: %d\n", r.Outcomes, len(r.Leaks))
	for _, l := range r.Leaks {
		fmt.Fprintln(w, "  leak:", l)
	}
	return nil
}

const hostName = "held-host"

// Run measures one host holding cfg.Turns silent turns.
func Run(ctx context.Context, cfg Config) (res Result, err error) {
	if cfg.Turns <= 0 {
		cfg.Turns = 100
	}
	if cfg.Window <= 0 {
		cfg.Window = time.Minute
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10*time.Minute + time.Duration(cfg.Turns)*time.Second
	}
	progress := cfg.Progress
	if progress == nil {
		progress = io.Discard
	}
	say := func(format string, args ...any) {
		fmt.Fprintf(progress, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	res = Result{Turns: cfg.Turns, Window: cfg.Window, Outcomes: map[string]int{}}

	bins, err := fleet.BinariesIn(cfg.Bin)
	if err != nil {
		return res, err
	}
	if res.NoFile, err = raiseNoFile(); err != nil {
		return res, fmt.Errorf("raise RLIMIT_NOFILE: %w", err)
	}
	dir := cfg.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "runnerd-held-"); err != nil {
			return res, err
		}
		if !cfg.Keep {
			defer os.RemoveAll(dir)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return res, err
	}
	stateDir := filepath.Join(dir, "state")
	logFile, err := os.OpenFile(filepath.Join(dir, "fleet.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return res, err
	}
	defer logFile.Close()

	cp, err := fleet.StartControlPlane(ctx, fleet.ControlPlaneConfig{
		Bin: bins.ControlPlane, DataDir: filepath.Join(dir, "controlplane"), Log: logFile,
	})
	if err != nil {
		return res, err
	}
	defer func() {
		err = errors.Join(err, cp.Stop(syscall.SIGTERM, 30*time.Second))
		cp.User.Close()
	}()
	tokenFile, err := cp.AddHost(ctx, hostName)
	if err != nil {
		return res, err
	}
	var renewRetry time.Duration // the product's 5 s unless the interval is shorter
	if cfg.RenewInterval > 0 && cfg.RenewInterval < 5*time.Second {
		renewRetry = cfg.RenewInterval
	}
	d, err := fleet.StartDaemon(ctx, fleet.DaemonConfig{
		Bin: bins.Runnerd, ControlPlaneURL: cp.URL, HostTokenFile: tokenFile, HostName: hostName,
		StateDir: stateDir, Capacity: cfg.Turns, RenewInterval: cfg.RenewInterval, RenewRetry: renewRetry,
		Args: []string{"--listen-metrics", "127.0.0.1:0"},
		Env:  cfg.DaemonEnv,
		Log:  logFile,
	})
	if err != nil {
		return res, err
	}
	defer func() {
		// The daemon drains what is left; supervisors outlive it by design.
		err = errors.Join(err, d.Stop(syscall.SIGTERM, 60*time.Second))
		if _, serr := fleet.StopProcs(10*time.Second, fleet.Under(stateDir)); serr != nil {
			err = errors.Join(err, serr)
		}
	}()
	m, err := d.AwaitOutput(0, regexp.MustCompile(`"msg":"runnerd_metrics_listening".*"addr":"([^"]+)"`), 30*time.Second)
	if err != nil {
		return res, fmt.Errorf("the daemon's metrics address: %w\n%s", err, d.Output())
	}
	metrics := &scraper{url: "http://" + m[1] + "/metrics"}
	u := cp.User
	if err := fleet.Poll(ctx, 200*time.Millisecond, "the daemon's first host heartbeat", func(ctx context.Context) (bool, error) {
		s, ok, err := u.Server(ctx, hostName)
		return ok && s.LastHeartbeat != nil, err
	}); err != nil {
		return res, err
	}
	snap := func() (snapshot, error) { return takeSnapshot(d.Pid(), stateDir, bins.Runnerd, bins.DemoAgent) }
	idle, err := snap()
	if err != nil {
		return res, err
	}
	res.Idle = idle.byRole()[RoleDaemon]
	if res.IdleGoroutines, err = metrics.gauge(ctx, "go_goroutines"); err != nil {
		return res, err
	}
	say("control plane %s, daemon pid %d idle: %d threads, %d KB RSS, %d goroutines", cp.URL, d.Pid(), res.Idle.Threads, res.Idle.RSSKB, res.IdleGoroutines)

	// N conversations, one silent turn each.
	start := time.Now()
	jobs := make([]wire.Job, cfg.Turns)
	convs := make([]string, cfg.Turns)
	if err := parallel(ctx, cfg.Turns, 8, func(ctx context.Context, i int) error {
		c, err := u.CreateConversation(ctx, fmt.Sprintf("held-%d", i), bins.DemoAgent)
		if err != nil {
			return err
		}
		convs[i] = c.ID
		jobs[i], err = u.Send(ctx, c.ID, prompt)
		return err
	}); err != nil {
		return res, fmt.Errorf("enqueue: %w", err)
	}
	say("%d turns enqueued in %v", cfg.Turns, time.Since(start).Round(time.Millisecond))

	// Held: the job runs and its agent has the prompt (the demo agent's
	// transcript says so); renewed: the attempt's lease expiry moved.
	firstExpiry := make([]time.Time, cfg.Turns)
	held := make([]bool, cfg.Turns)
	lastSaid := time.Now()
	if err := fleet.Poll(ctx, time.Second, "every turn held", func(ctx context.Context) (bool, error) {
		n := 0
		for i, c := range convs {
			if !held[i] {
				tr, err := fleet.Transcript(stateDir, c)
				held[i] = err == nil && len(tr) == 1
			}
			if held[i] {
				n++
			}
		}
		if time.Since(lastSaid) > 15*time.Second {
			say("%d of %d turns held", n, cfg.Turns)
			lastSaid = time.Now()
		}
		select {
		case <-d.Done():
			return false, fmt.Errorf("the daemon exited: %v", d.Err())
		default:
		}
		return n == cfg.Turns, nil
	}); err != nil {
		return res, err
	}
	say("all %d turns held after %v", cfg.Turns, time.Since(start).Round(time.Millisecond))
	renewed := make([]bool, cfg.Turns)
	if err := fleet.Poll(ctx, 2*time.Second, "every held lease renewed", func(ctx context.Context) (bool, error) {
		var mu sync.Mutex
		n := 0
		err := parallel(ctx, cfg.Turns, 8, func(ctx context.Context, i int) error {
			if renewed[i] {
				mu.Lock()
				n++
				mu.Unlock()
				return nil
			}
			j, err := u.Job(ctx, jobs[i].ID)
			if err != nil {
				return err
			}
			if j.State != wire.JobRunning || len(j.Attempts) != 1 {
				return fmt.Errorf("job %s is %s with %d attempts, not held", j.ID, j.State, len(j.Attempts))
			}
			exp := j.Attempts[0].LeaseExpiresAt
			if firstExpiry[i].IsZero() {
				firstExpiry[i] = exp
			} else if exp.After(firstExpiry[i]) {
				renewed[i] = true
				mu.Lock()
				n++
				mu.Unlock()
			}
			return nil
		})
		return n == cfg.Turns, err
	}); err != nil {
		return res, err
	}
	res.Hold = time.Since(start)
	say("every lease renewed after %v; counting CPU for %v", res.Hold.Round(time.Millisecond), cfg.Window)

	// The window: CPU between two snapshots, memory and threads at its end.
	before, err := snap()
	if err != nil {
		return res, err
	}
	select {
	case <-time.After(cfg.Window):
	case <-ctx.Done():
		return res, ctx.Err()
	}
	after, err := snap()
	if err != nil {
		return res, err
	}
	res.LoadAvg = loadAvg()
	if res.HeldGoroutines, err = metrics.gauge(ctx, "go_goroutines"); err != nil {
		return res, err
	}
	cpu := after.cpuSince(before)
	res.Roles = after.byRole()
	for k, u := range res.Roles {
		u.CPUTicks = cpu[k]
		res.Roles[k] = u
		res.Host.add(u)
	}
	res.Daemon = res.Roles[RoleDaemon]
	say("held: daemon %d threads, %d KB RSS, %d goroutines; host %d processes, %d threads, %d KB PSS",
		res.Daemon.Threads, res.Daemon.RSSKB, res.HeldGoroutines, res.Host.Processes, res.Host.Threads, res.Host.PSSKB)

	// End every turn by the user's cancel, and look for what stayed.
	if err := parallel(ctx, cfg.Turns, 8, func(ctx context.Context, i int) error {
		_, err := u.Cancel(ctx, jobs[i].ID)
		return err
	}); err != nil {
		return res, fmt.Errorf("cancel: %w", err)
	}
	var mu sync.Mutex
	if err := parallel(ctx, cfg.Turns, 8, func(ctx context.Context, i int) error {
		j, err := u.WaitEnded(ctx, jobs[i].ID, time.Second)
		if err != nil {
			return err
		}
		mu.Lock()
		res.Outcomes[j.State]++
		mu.Unlock()
		return nil
	}); err != nil {
		return res, err
	}
	say("every turn ended: %v", res.Outcomes)
	res.Leaks, res.After, res.AfterGoroutines, err = leftovers(ctx, snap, metrics, stateDir, res)
	return res, err
}

// prompt keeps the demo agent silent until it is interrupted.
const prompt = "Hold this turn.\n!hang"

// leftovers waits up to half a minute for the host to settle after every
// turn ended, then lists what is still there that should not be.
func leftovers(ctx context.Context, snap func() (snapshot, error), metrics *scraper, stateDir string, r Result) (leaks []string, daemon Usage, goroutines int, err error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		leaks = nil
		s, err := snap()
		if err != nil {
			return nil, daemon, 0, err
		}
		roles := s.byRole()
		daemon = roles[RoleDaemon]
		if goroutines, err = metrics.gauge(ctx, "go_goroutines"); err != nil {
			return nil, daemon, 0, err
		}
		if n := roles[RoleTurn].Processes; n > 0 {
			leaks = append(leaks, fmt.Sprintf("%d turn children alive", n))
		}
		if n := roles[RoleAgent].Processes; n > 0 {
			leaks = append(leaks, fmt.Sprintf("%d agents alive", n))
		}
		if n := roles[RoleSupervisor].Processes; n > r.Turns {
			leaks = append(leaks, fmt.Sprintf("%d supervisors for %d conversations", n, r.Turns))
		}
		if ents, _ := os.ReadDir(filepath.Join(stateDir, "attempts")); len(ents) > 0 {
			leaks = append(leaks, fmt.Sprintf("%d entries left in the attempts directory", len(ents)))
		}
		// Pooled connections to the control plane stay open a while (a
		// descriptor and two goroutines each); a few goroutines come and go
		// with the long poll and the host heartbeat.
		conns := max(daemon.TCP-r.Idle.TCP, 0)
		if goroutines > r.IdleGoroutines+2*conns+10 {
			leaks = append(leaks, fmt.Sprintf("%d goroutines, %d when idle (%d more pooled connections)", goroutines, r.IdleGoroutines, conns))
		}
		if other, idle := daemon.FDs-daemon.TCP, r.Idle.FDs-r.Idle.TCP; other > idle+2 {
			leaks = append(leaks, fmt.Sprintf("%d descriptors besides TCP connections, %d when idle", other, idle))
		}
		if len(leaks) == 0 || time.Now().After(deadline) {
			return leaks, daemon, goroutines, nil
		}
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
			return leaks, daemon, goroutines, ctx.Err()
		}
	}
}

// parallel runs f for 0..n-1 on width goroutines and returns the first error.
func parallel(ctx context.Context, n, width int, f func(context.Context, int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan int)
	errs := make(chan error, width)
	var wg sync.WaitGroup
	for range width {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(ctx, i); err != nil {
					errs <- err
					cancel()
					return
				}
			}
		}()
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	return ctx.Err()
}

// scraper reads gauges of the daemon's /metrics.
type scraper struct{ url string }

func (s *scraper) gauge(ctx context.Context, name string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("scrape the daemon's metrics: %w", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return int(f), err
		}
	}
	return 0, fmt.Errorf("the daemon's metrics have no %s", name)
}
