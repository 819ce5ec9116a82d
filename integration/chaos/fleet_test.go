package chaos

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/integration/chaos/checker"
	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/runner"
	"github.com/runnerd/runnerd/wire"
)

// Scaled timings (integration/doc.go): the defaults' 120 s lease and 30 s
// renewals become 2 s and 400 ms, a little above the integration tests'
// so that a 2-core machine under make test is not itself the fault.
const (
	leaseTTL       = 2 * time.Second
	renewEvery     = 400 * time.Millisecond
	renewTimeout   = 250 * time.Millisecond
	renewRetry     = 50 * time.Millisecond
	stopGrace      = 300 * time.Millisecond
	killGrace      = 300 * time.Millisecond
	reaperGrace    = 1500 * time.Millisecond // stop + kill grace and room for the supervisor (P3)
	reaperInterval = 100 * time.Millisecond
	claimWait      = 500 * time.Millisecond
	replicaPort    = 8080
	// sandboxIdle is every host's --sandbox-idle: a conversation's
	// sandbox is stopped after this long without a turn and woken (K13's
	// verification) by its next one, so eviction and wake happen under
	// the campaign's faults (S1).
	sandboxIdle = 2 * time.Second
)

// world is one campaign's fleet.
type world struct {
	t    *testing.T
	ctx  context.Context
	dir  string
	hist *checker.Writer
	log  *syncLog
	nw   *network
	pg   *postgres
	toxi *toxiproxy.ApiServer
	seed uint64
	obs  *observer

	replicas []*replica
	hosts    []*host
	users    []*fleet.User // one per replica, through its user recorder
	dataDir  string        // the replicas' shared data directory (the user token)
	// regToken is the registration token file every host registers
	// itself with on its first start (runnerd run --registration-token-file).
	regToken string
	image    string // the docker agent's image

	jobsMu sync.Mutex // guards jobs and children
	jobs   []string   // every job a replica said it enqueued, in order
	// children are the turn children by pid, from the daemons'
	// runnerd_turn_accepted records: which attempt each one runs.
	children map[int]childRef
}

type childRef struct{ job, attempt string }

// acceptTap reads a daemon's records on their way to the log and notes
// which attempt each turn child runs.
type acceptTap struct {
	w    *world
	host string
	next io.Writer
}

// kept are the records of a daemon (or its turn children) the history
// keeps (checker.Daemon): the replica properties' evidence of a lease
// lost, the idle sandboxes stopped and woken, the moves between replicas.
var kept = [][]byte{
	[]byte(`"msg":"` + diagnostics.MsgLeaseExpired + `"`), []byte(`"msg":"` + diagnostics.MsgLeaseLost + `"`),
	[]byte(`"msg":"` + diagnostics.MsgSandboxEvicted + `"`), []byte(`"msg":"` + diagnostics.MsgSandboxWoken + `"`),
	[]byte(`"msg":"` + runner.MsgControlPlaneSwitched + `"`),
}

func (a *acceptTap) Write(b []byte) (int, error) {
	for line := range bytes.Lines(b) {
		a.keep(line)
	}
	return a.next.Write(b)
}

// keep notes a turn child's attempt and writes a kept record to the
// history, with the host's name.
func (a *acceptTap) keep(b []byte) {
	if slices.ContainsFunc(kept, func(k []byte) bool { return bytes.Contains(b, k) }) {
		var r struct {
			Msg     string `json:"msg"`
			Job     string `json:"job_id"`
			Attempt string `json:"attempt_id"`
			Conv    string `json:"conversation_id"`
		}
		if json.Unmarshal(b, &r) == nil {
			_ = a.w.hist.Write(checker.Record{Host: a.host, JobID: r.Job, AttemptID: r.Attempt, ConversationID: r.Conv,
				Daemon: &checker.Daemon{Msg: r.Msg}})
		}
	}
	if bytes.Contains(b, []byte(`"runnerd_turn_accepted"`)) {
		var r struct {
			Msg     string `json:"msg"`
			PID     int    `json:"pid"`
			Job     string `json:"job_id"`
			Attempt string `json:"attempt_id"`
		}
		if json.Unmarshal(b, &r) == nil && r.PID != 0 {
			a.w.jobsMu.Lock()
			if a.w.children == nil {
				a.w.children = map[int]childRef{}
			}
			a.w.children[r.PID] = childRef{r.Job, r.Attempt}
			a.w.jobsMu.Unlock()
		}
	}
}

// child is the attempt turn child pid runs, if its daemon said.
func (w *world) child(pid int) childRef {
	w.jobsMu.Lock()
	defer w.jobsMu.Unlock()
	return w.children[pid]
}

// enqueued notes a job a replica's send_message answer named.
func (w *world) enqueued(id string) {
	w.jobsMu.Lock()
	if !slices.Contains(w.jobs, id) {
		w.jobs = append(w.jobs, id)
	}
	w.jobsMu.Unlock()
}

// replica is one control-plane replica in its own namespace.
type replica struct {
	name string
	node *node
	url  string // http://ip:port, as the recorders reach it
	cfg  fleet.ControlPlaneConfig

	mu   sync.Mutex // guards cp and skew: faults restart the replica
	cp   *fleet.ControlPlane
	skew time.Duration
}

// host is one runnerd host in its own namespace.
type host struct {
	name     string
	node     *node
	sandbox  string // process | docker
	runnerd  string // its own hard link of runnerd: its processes are told apart by it
	stateDir string
	token    string  // its host token file, written by its registration
	paths    []*path // one per replica, the preferred one first (--control-plane's order)

	mu sync.Mutex // guards d: faults restart the daemon
	d  *fleet.Daemon
}

// path is the way from one host to one replica: a toxiproxy proxy (the
// network's faults) in front of a recorder (the history, drop_response).
type path struct {
	host    *host
	replica *replica
	proxy   *toxiproxy.Proxy
	rec     *recorder
}

func (h *host) daemon() *fleet.Daemon {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.d
}

func (r *replica) current() *fleet.ControlPlane {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cp
}

// syncLog is the processes' output, one file for the whole campaign.
type syncLog struct {
	mu sync.Mutex // guards f
	f  *os.File
}

func (l *syncLog) prefixed(p string) io.Writer { return &prefixWriter{l: l, p: p} }

type prefixWriter struct {
	l *syncLog
	p string
}

func (w *prefixWriter) Write(b []byte) (int, error) {
	w.l.mu.Lock()
	defer w.l.mu.Unlock()
	fmt.Fprintf(w.l.f, "%s %s| %s", time.Now().Format("15:04:05.000"), w.p, b)
	return len(b), nil
}

type fleetOpts struct {
	hosts        int // at least 3; the last one runs the docker backend
	capacity     int
	dockerHosts  int
	keep         bool   // keep the campaign directory (the history) after a pass
	controlPlane string // the replicas' executable; default bins.ControlPlane
}

// newWorld starts the fleet: PostgreSQL, two replicas, the hosts with
// their balancers, proxies and recorders. Everything stops in t.Cleanup.
func newWorld(t *testing.T, seed uint64, o fleetOpts) *world {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dir, err := os.MkdirTemp("", "runnerd-chaos-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, ctx: ctx, dir: dir, seed: seed}
	t.Cleanup(func() {
		if !t.Failed() && !o.keep {
			os.RemoveAll(dir)
		}
	})
	t.Logf("campaign directory %s (history.jsonl, output.log)", dir)
	lf, err := os.Create(filepath.Join(dir, "output.log"))
	if err != nil {
		t.Fatal(err)
	}
	w.log = &syncLog{f: lf}
	t.Cleanup(func() { lf.Close() })
	if w.hist, err = checker.Create(filepath.Join(dir, "history.jsonl")); err != nil {
		t.Fatal(err)
	}

	w.nw = newNetwork(t)
	w.pg = startPostgres(t, w.nw.gw, w.nw.prefix+"0/24", freePort(t, w.nw.gw), w.log.prefixed("postgres"))
	w.process(checker.RolePostgres, checker.ProcessStart, "", "", w.pg.pid(), nil)
	w.toxi = toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())

	w.dataDir = filepath.Join(dir, "cp")
	if err := os.Mkdir(w.dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		n := w.nw.add(fmt.Sprintf("r%d", i+1), 21+i)
		r := &replica{name: n.name, node: n, url: fmt.Sprintf("http://%s:%d", n.ip, replicaPort)}
		r.cfg = fleet.ControlPlaneConfig{
			Bin: cmp.Or(o.controlPlane, bins.ControlPlane), DataDir: w.dataDir, DB: w.pg.dsn(), Wrap: n.wrap(),
			Listen:   fmt.Sprintf("%s:%d", n.ip, replicaPort),
			LeaseTTL: leaseTTL, MinLeaseTTL: renewEvery + renewTimeout, ReaperInterval: reaperInterval,
			ReaperGrace: reaperGrace, ClaimWaitMax: time.Second, ReleaseBackoff: 200 * time.Millisecond,
			Log: w.log.prefixed(n.name), StartTimeout: 60 * time.Second,
		}
		// The first replica makes the user token; the second finds it.
		if err := w.startReplica(r, 0); err != nil {
			t.Fatal(err)
		}
		w.replicas = append(w.replicas, r)
		t.Cleanup(func() { w.stopReplica(r, syscall.SIGTERM) })
	}
	tok, err := os.ReadFile(filepath.Join(w.dataDir, "user-token"))
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range w.replicas {
		rec, err := startRecorder("", r.name, r.url, w.hist, seed+uint64(100+i))
		if err != nil {
			t.Fatal(err)
		}
		rec.onJob = w.enqueued
		t.Cleanup(rec.close)
		u := fleet.NewUser("http://"+rec.addr(), strings.TrimSpace(string(tok)))
		t.Cleanup(u.Close)
		w.users = append(w.users, u)
	}

	// The hosts register themselves (no host add): one token for all.
	if w.regToken, err = w.replicas[0].current().RegistrationToken(ctx, "chaos", o.hosts); err != nil {
		t.Fatal(err)
	}
	for i := range o.hosts {
		n := w.nw.add(fmt.Sprintf("h%d", i+1), 11+i)
		h := &host{name: "chaos-" + n.name, node: n, sandbox: "process"}
		if i >= o.hosts-o.dockerHosts {
			h.sandbox = "docker"
		}
		hdir := filepath.Join(dir, n.name)
		if err := os.Mkdir(hdir, 0o755); err != nil {
			t.Fatal(err)
		}
		h.runnerd, h.stateDir = filepath.Join(hdir, "runnerd"), filepath.Join(hdir, "state")
		if err := os.Link(bins.Runnerd, h.runnerd); err != nil {
			t.Fatal(err)
		}
		h.token = filepath.Join(h.stateDir, "host-token")
		// Every host is given both replicas' addresses, each host
		// preferring another one, so that a replica's loss hits some
		// hosts' preferred address and others' second.
		for k := range w.replicas {
			j := (i + k) % len(w.replicas)
			r := w.replicas[j]
			rec, err := startRecorder(h.name, r.name, r.url, w.hist, seed+uint64(10*i+j))
			if err != nil {
				t.Fatal(err)
			}
			rec.onJob = w.enqueued
			t.Cleanup(rec.close)
			// On the bridge's gateway: the hosts' namespaces reach it.
			px := toxiproxy.NewProxy(w.toxi, n.name+"-"+r.name, w.nw.gw+":0", rec.addr())
			if err := px.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(px.Stop)
			h.paths = append(h.paths, &path{host: h, replica: r, proxy: px, rec: rec})
		}
		w.hosts = append(w.hosts, h)
	}
	return w
}

// freePort is a port free on ip now.
func freePort(t *testing.T, ip string) int {
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// process records a process's start or exit.
func (w *world) process(role, event, host, replica string, pid int, err error) {
	p := &checker.Process{Role: role, Event: event, PID: pid}
	if event == checker.ProcessExit {
		code, sig := exitOf(err)
		p.ExitCode, p.Signal = code, sig
	}
	_ = w.hist.Write(checker.Record{Host: host, Replica: replica, Process: p})
}

// exitOf splits a Wait error into an exit code or a signal's name.
func exitOf(err error) (*int, string) {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return nil, signalName(ws.Signal())
		}
		c := ee.ExitCode()
		return &c, ""
	}
	zero := 0
	if err == nil {
		return &zero, ""
	}
	return nil, ""
}

func signalName(s syscall.Signal) string {
	switch s {
	case syscall.SIGKILL:
		return "KILL"
	case syscall.SIGTERM:
		return "TERM"
	case syscall.SIGINT:
		return "INT"
	case syscall.SIGQUIT:
		return "QUIT"
	}
	return fmt.Sprint(int(s))
}

// watch records the exit of a process the campaign started.
func (w *world) watch(p *fleet.Process, role, host, replica string) {
	go func() {
		err := p.Err()
		w.process(role, checker.ProcessExit, host, replica, p.Pid(), err)
	}()
}

// startReplica starts r (the real controlplane serve, or skewcp with its
// own clock off by skew).
func (w *world) startReplica(r *replica, skew time.Duration) error {
	cfg := r.cfg
	if skew != 0 {
		// skewcp reads its offset from SKEWCP_CLOCK_OFFSET: env sets it
		// and execs, so the pid stays the replica's.
		cfg.Bin = skewcp
		cfg.Wrap = append(append([]string{}, cfg.Wrap...), "env", "SKEWCP_CLOCK_OFFSET="+skew.String())
	}
	cp, err := fleet.StartControlPlane(w.ctx, cfg)
	if err != nil {
		return fmt.Errorf("replica %s: %w", r.name, err)
	}
	cp.User.Close() // the campaign speaks through the user recorders
	r.mu.Lock()
	r.cp, r.skew = cp, skew
	r.mu.Unlock()
	w.process(checker.RoleReplica, checker.ProcessStart, "", r.name, cp.Pid(), nil)
	w.watch(cp.Process, checker.RoleReplica, "", r.name)
	return nil
}

// stopReplica stops the replica with sig and waits (SIGKILL after 15 s).
func (w *world) stopReplica(r *replica, sig syscall.Signal) {
	cp := r.current()
	if cp == nil {
		return
	}
	_ = cp.Stop(sig, 15*time.Second)
}

// startDaemon starts (or starts again) host h's daemon.
func (w *world) startDaemon(h *host) error {
	var urls []string
	for _, p := range h.paths {
		urls = append(urls, "http://"+p.proxy.Listen)
	}
	cfg := fleet.DaemonConfig{
		Bin: h.runnerd, Wrap: h.node.wrap(),
		ControlPlaneURL: strings.Join(urls, ","), HostTokenFile: h.token, HostName: h.name, StateDir: h.stateDir,
		Capacity: 4, Sandbox: h.sandbox,
		LeaseTTL: leaseTTL, RenewInterval: renewEvery, RenewTimeout: renewTimeout, RenewRetry: renewRetry,
		ReceiptTimeout: 600 * time.Millisecond, ReceiptRetry: 50 * time.Millisecond,
		StopGrace: stopGrace, KillGrace: killGrace, DrainTimeout: 10 * time.Second,
		ClaimWait: claimWait, ClaimBackoff: 100 * time.Millisecond, ClaimBackoffMax: time.Second,
		ControlTimeout: time.Second, HostHeartbeat: 300 * time.Millisecond,
		// The sweep removes a sandbox an attempt here started and ended
		// before recording once another host records the conversation's:
		// every second, so that one is gone long before the campaign
		// judges what is left (the default minute outlasts a short run).
		Args: []string{"--sandbox-sweep", time.Second.String(), "--sandbox-idle", sandboxIdle.String(),
			"--registration-token-file", w.regToken},
		Log: &acceptTap{w: w, host: h.name, next: w.log.prefixed(h.node.name)},
	}
	if h.sandbox == "docker" {
		cfg.StopGrace = 2 * time.Second // a container's supervisor answers slower
	}
	d, err := fleet.StartDaemon(w.ctx, cfg)
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.d = d
	h.mu.Unlock()
	w.process(checker.RoleDaemon, checker.ProcessStart, h.name, "", d.Pid(), nil)
	w.watch(d.Process, checker.RoleDaemon, h.name, "")
	return nil
}

// stopDaemons drains every daemon (SIGTERM; a second one, then SIGKILL,
// if it takes too long).
func (w *world) stopDaemons() {
	var wg sync.WaitGroup
	for _, h := range w.hosts {
		d := h.daemon()
		if d == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.Signal(syscall.SIGCONT) // a stopped daemon must hear the TERM
			d.Signal(syscall.SIGTERM)
			if d.Wait(15*time.Second) != nil {
				d.Signal(syscall.SIGTERM)
			}
			_ = d.Stop(syscall.SIGKILL, 10*time.Second)
		}()
	}
	wg.Wait()
}

// user calls the user API on the first replica that answers: a transport
// failure (a replica down or cut off) or the recorder's word that the
// request never left moves on to the other; an answer, even a refusal, is
// the answer. Only for calls that may be repeated (reads, creating a
// conversation); userOnce for a message.
func (w *world) user(ctx context.Context, f func(*fleet.User) error) error {
	var err error
	for i := range 2 * len(w.users) {
		err = f(w.users[i%len(w.users)])
		var te *wire.TransportError
		if err == nil || !(errors.As(err, &te) || unreached(err)) || ctx.Err() != nil {
			return err
		}
	}
	return err
}

func unreached(err error) bool {
	var se *wire.StatusError
	return errors.As(err, &se) && se.Status == http.StatusBadGateway && se.Code == codeUnreached
}

// userOnce is user for a call that must not be repeated (a message: the
// user API has no idempotency key for it): it moves to the other replica
// only when the request provably never reached one. ambiguous says the
// call may have been applied although it failed: no answer, or a 5xx.
func (w *world) userOnce(ctx context.Context, f func(*fleet.User) error) (ambiguous bool, err error) {
	for _, u := range w.users {
		err = f(u)
		if unreached(err) {
			continue
		}
		var te *wire.TransportError
		var se *wire.StatusError
		return errors.As(err, &te) || errors.As(err, &se) && se.Status >= 500, err
	}
	return false, err
}
