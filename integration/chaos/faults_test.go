package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/runnerd/runnerd/integration/chaos/checker"
)

// A fault is drawn from the seed — its kind, its target, its parameters,
// how long it lasts, the gap before the next — and bounded: at most
// maxFaults in all, at most two at once, none longer than maxLength, and
// every one healed before the campaign's final wait. Which pid a process
// fault hits depends on what runs at that moment, so a seed replays the
// same sequence of faults, not the same interleaving.
type faultKind struct {
	name   string
	weight int
	inject func(f *faults, rng *rand.Rand, d time.Duration) (rec checker.Record, heal func(), ok bool)
}

type faults struct {
	w     *world
	rng   *rand.Rand
	kinds []faultKind // the mix drawn from

	// busy: host faults hit hosts that run turns now.
	busy bool

	mu     sync.Mutex // guards held and counts
	held   map[string]bool
	counts map[string]int
	wg     sync.WaitGroup
}

// kinds is the fault mix, weights in percent-ish parts.
var kinds = []faultKind{
	{"latency", 10, (*faults).toxicLatency},
	{"bandwidth", 4, (*faults).toxicBandwidth},
	{"timeout", 6, (*faults).toxicTimeout},
	{"reset", 6, (*faults).toxicReset},
	{"loss", 6, (*faults).toxicLoss},
	{"limit_data", 4, (*faults).toxicLimitData},
	{"drop_response", 10, (*faults).dropResponse},
	{"partition_host", 6, (*faults).partitionHost},
	{"partition_replica", 5, (*faults).partitionReplica},
	{"stop_host", 4, (*faults).stopHost},
	{"kill_daemon", 6, (*faults).killDaemon},
	{"stop_daemon", 5, (*faults).stopDaemon},
	{"kill_child", 6, (*faults).killChild},
	{"stop_child", 4, (*faults).stopChild},
	{"kill_supervisor", 2, (*faults).killSupervisor},
	{"stop_supervisor", 3, (*faults).stopSupervisor},
	{"kill_replica", 4, (*faults).killReplica},
	{"stop_replica", 3, (*faults).stopReplica},
	{"restart_replica", 3, (*faults).restartReplica},
	{"clock_offset", 3, (*faults).clockOffset},
	{"postgres_restart", 3, (*faults).postgresRestart},
}

// newFaults draws from the kinds named in only, or from every kind.
func newFaults(w *world, seed uint64, only ...string) *faults {
	f := &faults{w: w, rng: rand.New(rand.NewPCG(seed, 0xfa17)), held: map[string]bool{}, counts: map[string]int{}}
	for _, k := range kinds {
		if len(only) == 0 || slices.Contains(only, k.name) {
			f.kinds = append(f.kinds, k)
		}
	}
	return f
}

// run injects faults until ctx ends or maxFaults were injected, each
// lasting from minLength to maxLength, then waits for every one to heal.
func (f *faults) run(ctx context.Context, maxFaults int, minLength, maxLength time.Duration) {
	defer f.wg.Wait()
	total := 0
	for _, k := range f.kinds {
		total += k.weight
	}
	sem := make(chan struct{}, 2)
	for n := 0; n < maxFaults; {
		gap := time.Duration(200+f.rng.IntN(1800)) * time.Millisecond
		d := minLength + time.Duration(f.rng.Int64N(int64(maxLength-minLength)/int64(time.Millisecond)+1))*time.Millisecond
		pick := f.rng.IntN(total)
		sub := rand.New(rand.NewPCG(f.rng.Uint64(), 0))
		select {
		case <-ctx.Done():
			return
		case <-time.After(gap):
		}
		select {
		case <-ctx.Done():
			return
		case sem <- struct{}{}:
		}
		var k faultKind
		for _, k = range f.kinds {
			if pick < k.weight {
				break
			}
			pick -= k.weight
		}
		if !f.apply(ctx, &f.wg, k, sub, d, func() { <-sem }) {
			<-sem
			continue
		}
		n++
	}
}

// apply injects one fault of kind k lasting d and heals it in the
// background, counted in wg (done runs then); false if it could not be
// injected now.
func (f *faults) apply(ctx context.Context, wg *sync.WaitGroup, k faultKind, rng *rand.Rand, d time.Duration, done func()) bool {
	rec, heal, ok := k.inject(f, rng, d)
	if !ok {
		return false
	}
	f.mu.Lock()
	f.counts[k.name]++
	f.mu.Unlock()
	start := time.Now()
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer done()
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
		heal()
		end := time.Now()
		rec.Fault.Start, rec.Fault.End = start, &end
		_ = f.w.hist.Write(rec)
	}()
	return true
}

// replicaLoss kills one replica (kill -9) after wait and starts it again
// d later, beside the drawn faults, so that every campaign, the short one
// too, judges a replica's loss (checker.ReplicaOffline, ReplicaLease).
// It waits for the replicas' slot if another fault holds it, and returns
// once the replica is back (at once when ctx ends).
func (f *faults) replicaLoss(ctx context.Context, wait, d time.Duration) {
	k := faultKind{name: "kill_replica", inject: (*faults).killReplica}
	rng := rand.New(rand.NewPCG(f.w.seed, 0x4e91))
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		if f.apply(ctx, &wg, k, rng, d, func() {}) {
			return
		}
		wait = 100 * time.Millisecond
	}
}

// mix is "name n, name n, …" of the faults injected.
func (f *faults) mix() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var parts []string
	for _, k := range kinds {
		if n := f.counts[k.name]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k.name, n))
		}
	}
	return strings.Join(parts, ", ")
}

// claim marks a target busy; false if another fault holds it.
func (f *faults) claim(target string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.held[target] {
		return false
	}
	f.held[target] = true
	return true
}

func (f *faults) release(target string) {
	f.mu.Lock()
	delete(f.held, target)
	f.mu.Unlock()
}

func fault(kind, role, detail string) checker.Record {
	return checker.Record{Fault: &checker.Fault{Kind: kind, Role: role, Detail: detail}}
}

// ---- network: toxiproxy on one host→replica path ----

func (f *faults) pickPath(rng *rand.Rand) *path {
	h := f.w.hosts[rng.IntN(len(f.w.hosts))]
	return h.paths[rng.IntN(len(h.paths))]
}

// toxic adds toxics to one path for the fault's length.
func (f *faults) toxic(rng *rand.Rand, kind, detail string, toxics ...string) (checker.Record, func(), bool) {
	p := f.pickPath(rng)
	target := "path " + p.proxy.Name
	if !f.claim(target) {
		return checker.Record{}, nil, false
	}
	var names []string
	for i, js := range toxics {
		name := fmt.Sprintf("chaos%d", i)
		js = strings.Replace(js, "{", fmt.Sprintf(`{"name":%q,`, name), 1)
		if _, err := p.proxy.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
			f.w.t.Errorf("toxic %s: %v", js, err)
			continue
		}
		names = append(names, name)
	}
	rec := fault(kind, "", detail)
	rec.Host, rec.Replica = p.host.name, p.replica.name
	return rec, func() {
		for _, n := range names {
			_ = p.proxy.Toxics.RemoveToxic(context.Background(), n)
		}
		f.release(target)
	}, true
}

func stream(rng *rand.Rand) string {
	if rng.IntN(2) == 0 {
		return "upstream"
	}
	return "downstream"
}

func (f *faults) toxicLatency(rng *rand.Rand, _ time.Duration) (checker.Record, func(), bool) {
	lat, jit := 50+rng.IntN(700), rng.IntN(300)
	s := stream(rng)
	return f.toxic(rng, checker.FaultLatency, fmt.Sprintf("latency=%dms jitter=%dms %s", lat, jit, s),
		fmt.Sprintf(`{"type":"latency","stream":%q,"attributes":{"latency":%d,"jitter":%d}}`, s, lat, jit))
}

func (f *faults) toxicBandwidth(rng *rand.Rand, _ time.Duration) (checker.Record, func(), bool) {
	rate := 1 + rng.IntN(20)
	s := stream(rng)
	return f.toxic(rng, checker.FaultBandwidth, fmt.Sprintf("rate=%dKB/s %s", rate, s),
		fmt.Sprintf(`{"type":"bandwidth","stream":%q,"attributes":{"rate":%d}}`, s, rate))
}

// toxicTimeout: the path passes nothing either way; connections close
// after timeout (0: held until healed).
func (f *faults) toxicTimeout(rng *rand.Rand, _ time.Duration) (checker.Record, func(), bool) {
	to := []int{0, 100, 500}[rng.IntN(3)]
	return f.toxic(rng, checker.FaultTimeout, fmt.Sprintf("timeout=%dms both ways", to),
		fmt.Sprintf(`{"type":"timeout","stream":"upstream","attributes":{"timeout":%d}}`, to),
		fmt.Sprintf(`{"type":"timeout","stream":"downstream","attributes":{"timeout":%d}}`, to))
}

func (f *faults) toxicReset(rng *rand.Rand, _ time.Duration) (checker.Record, func(), bool) {
	to := rng.IntN(300)
	s := stream(rng)
	return f.toxic(rng, checker.FaultReset, fmt.Sprintf("reset_peer timeout=%dms %s", to, s),
		fmt.Sprintf(`{"type":"reset_peer","stream":%q,"attributes":{"timeout":%d}}`, s, to))
}

// toxicLoss: one direction passes nothing (the requests, or the answers).
func (f *faults) toxicLoss(rng *rand.Rand, _ time.Duration) (checker.Record, func(), bool) {
	s := stream(rng)
	return f.toxic(rng, checker.FaultLoss, "one-way loss "+s,
		fmt.Sprintf(`{"type":"timeout","stream":%q,"attributes":{"timeout":0}}`, s))
}

func (f *faults) toxicLimitData(rng *rand.Rand, _ time.Duration) (checker.Record, func(), bool) {
	n := 200 + rng.IntN(4000)
	s := stream(rng)
	return f.toxic(rng, checker.FaultReset, fmt.Sprintf("limit_data bytes=%d %s", n, s),
		fmt.Sprintf(`{"type":"limit_data","stream":%q,"attributes":{"bytes":%d}}`, s, n))
}

// dropResponse: the recorder forwards and the replica commits, the host
// is never answered.
func (f *faults) dropResponse(rng *rand.Rand, _ time.Duration) (checker.Record, func(), bool) {
	p := f.pickPath(rng)
	target := "drop " + p.proxy.Name
	if !f.claim(target) {
		return checker.Record{}, nil, false
	}
	prob := []float64{0.3, 0.7, 1}[rng.IntN(3)]
	p.rec.withhold(prob)
	rec := fault(checker.FaultDropResponse, "", fmt.Sprintf("probability=%.1f", prob))
	rec.Host, rec.Replica = p.host.name, p.replica.name
	return rec, func() { p.rec.withhold(0); f.release(target) }, true
}

// ---- partitions ----

// pickHost chooses a host; with busy set, one that runs a turn child now
// (the broken build's campaign wants its faults where turns are).
func (f *faults) pickHost(rng *rand.Rand) *host {
	if !f.busy {
		return f.w.hosts[rng.IntN(len(f.w.hosts))]
	}
	var busy []*host
	for _, h := range f.w.hosts {
		if _, ob, ok := f.pickObservedOn(rng, checker.RoleChild, h.name); ok && ob.host == h.name {
			busy = append(busy, h)
		}
	}
	if len(busy) == 0 {
		return f.w.hosts[rng.IntN(len(f.w.hosts))]
	}
	return busy[rng.IntN(len(busy))]
}

func (f *faults) partitionHost(rng *rand.Rand, _ time.Duration) (checker.Record, func(), bool) {
	h := f.pickHost(rng)
	return f.partition(h.node, checker.RoleHost, h.name, "")
}

func (f *faults) partitionReplica(rng *rand.Rand, _ time.Duration) (checker.Record, func(), bool) {
	r := f.w.replicas[rng.IntN(len(f.w.replicas))]
	return f.partition(r.node, checker.RoleReplica, "", r.name)
}

func (f *faults) partition(n *node, role, host, replica string) (checker.Record, func(), bool) {
	target := "node " + n.name
	if !f.claim(target) {
		return checker.Record{}, nil, false
	}
	if err := f.w.nw.cut(n, true); err != nil {
		f.w.t.Errorf("partition %s: %v", n.name, err)
		f.release(target)
		return checker.Record{}, nil, false
	}
	rec := fault(checker.FaultPartition, role, "link down")
	rec.Host, rec.Replica = host, replica
	return rec, func() {
		if err := f.w.nw.cut(n, false); err != nil {
			f.w.t.Errorf("heal partition %s: %v", n.name, err)
		}
		f.release(target)
	}, true
}

// ---- processes ----

func (f *faults) killDaemon(rng *rand.Rand, _ time.Duration) (checker.Record, func(), bool) {
	h := f.w.hosts[rng.IntN(len(f.w.hosts))]
	target := "daemon " + h.name
	if !f.claim(target) {
		return checker.Record{}, nil, false
	}
	d := h.daemon()
	d.Signal(syscall.SIGKILL)
	rec := fault(checker.FaultKill, checker.RoleDaemon, fmt.Sprintf("pid %d, started again at the end", d.Pid()))
	rec.Host = h.name
	return rec, func() {
		<-d.Done()
		if err := f.w.startDaemon(h); err != nil {
			f.w.t.Errorf("restart the daemon of %s: %v", h.name, err)
		}
		f.release(target)
	}, true
}

func (f *faults) stopDaemon(rng *rand.Rand, _ time.Duration) (checker.Record, func(), bool) {
	h := f.w.hosts[rng.IntN(len(f.w.hosts))]
	target := "daemon " + h.name
	if !f.claim(target) {
		return checker.Record{}, nil, false
	}
	d := h.daemon()
	d.Signal(syscall.SIGSTOP)
	rec := fault(checker.FaultStop, checker.RoleDaemon, fmt.Sprintf("pid %d", d.Pid()))
	rec.Host = h.name
	return rec, func() { d.Signal(syscall.SIGCONT); f.release(target) }, true
}

// stopHost freezes a whole host, as a paused VM: its daemon and every
// process of it the observer knows (turn children, supervisors, agents)
// get SIGSTOP, and SIGCONT together at the end.
func (f *faults) stopHost(rng *rand.Rand, _ time.Duration) (checker.Record, func(), bool) {
	h := f.pickHost(rng)
	target := "daemon " + h.name
	if !f.claim(target) {
		return checker.Record{}, nil, false
	}
	d := h.daemon()
	pids := []int{d.Pid()}
	f.w.obs.mu.Lock()
	for pid, ob := range f.w.obs.live {
		if ob.host == h.name {
			pids = append(pids, pid)
		}
	}
	f.w.obs.mu.Unlock()
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGSTOP)
	}
	rec := fault(checker.FaultStop, checker.RoleHost, fmt.Sprintf("%d processes", len(pids)))
	rec.Host = h.name
	return rec, func() {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
		f.release(target)
	}, true
}

// pickObserved chooses a live observed process of role, in pid order.
func (f *faults) pickObserved(rng *rand.Rand, role string) (int, observed, bool) {
	return f.pickObservedOn(rng, role, "")
}

// pickObservedOn is pickObserved on one host ("": any).
func (f *faults) pickObservedOn(rng *rand.Rand, role, host string) (int, observed, bool) {
	o := f.w.obs
	o.mu.Lock()
	var pids []int
	for pid, ob := range o.live {
		if ob.role == role && (host == "" || ob.host == host) {
			pids = append(pids, pid)
		}
	}
	o.mu.Unlock()
	if len(pids) == 0 {
		return 0, observed{}, false
	}
	slices.Sort(pids)
	pid := pids[rng.IntN(len(pids))]
	o.mu.Lock()
	ob := o.live[pid]
	o.mu.Unlock()
	return pid, ob, true
}

func (f *faults) signalProc(rng *rand.Rand, role string, stop bool) (checker.Record, func(), bool) {
	pid, ob, ok := f.pickObserved(rng, role)
	if !ok {
		return checker.Record{}, nil, false
	}
	target := fmt.Sprintf("pid %d", pid)
	if !f.claim(target) {
		return checker.Record{}, nil, false
	}
	kind, sig := checker.FaultKill, syscall.SIGKILL
	if stop {
		kind, sig = checker.FaultStop, syscall.SIGSTOP
	}
	if !procAlive(pid) || syscall.Kill(pid, sig) != nil {
		f.release(target)
		return checker.Record{}, nil, false
	}
	rec := fault(kind, role, target)
	rec.Host, rec.ConversationID = ob.host, ob.conv
	if role == checker.RoleChild {
		c := f.w.child(pid)
		rec.JobID, rec.AttemptID = c.job, c.attempt
	}
	return rec, func() {
		if stop {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
		f.release(target)
	}, true
}

func (f *faults) killChild(rng *rand.Rand, _ time.Duration) (checker.Record, func(), bool) {
	return f.signalProc(rng, checker.RoleChild, false)
}

func (f *faults) stopChild(rng *rand.Rand, _ time.Duration) (checker.Record, func(), bool) {
	return f.signalProc(rng, checker.RoleChild, true)
}

func (f *faults) killSupervisor(rng *rand.Rand, _ time.Duration) (checker.Record, func(), bool) {
	return f.signalProc(rng, checker.RoleSupervisor, false)
}

func (f *faults) stopSupervisor(rng *rand.Rand, _ time.Duration) (checker.Record, func(), bool) {
	return f.signalProc(rng, checker.RoleSupervisor, true)
}

// ---- replicas and the database ----

// global claims the one slot of the faults that stop a replica or the
// database, so that they do not pile up on each other.
func (f *faults) replicaFault(rng *rand.Rand, kind string, detail func(*replica) string,
	act func(*replica) error, heal func(*replica) error) (checker.Record, func(), bool) {
	r := f.w.replicas[rng.IntN(len(f.w.replicas))]
	if !f.claim("global") {
		return checker.Record{}, nil, false
	}
	rec := fault(kind, checker.RoleReplica, detail(r))
	rec.Replica = r.name
	if err := act(r); err != nil {
		f.w.t.Errorf("fault %s on %s: %v", kind, r.name, err)
	}
	return rec, func() {
		if err := heal(r); err != nil {
			f.w.t.Errorf("heal %s on %s: %v", kind, r.name, err)
		}
		f.release("global")
	}, true
}

func (f *faults) killReplica(rng *rand.Rand, _ time.Duration) (checker.Record, func(), bool) {
	return f.replicaFault(rng, checker.FaultKill, func(r *replica) string { return fmt.Sprintf("pid %d", r.current().Pid()) },
		func(r *replica) error { f.w.stopReplica(r, syscall.SIGKILL); return nil },
		func(r *replica) error { return f.w.startReplica(r, 0) })
}

func (f *faults) stopReplica(rng *rand.Rand, _ time.Duration) (checker.Record, func(), bool) {
	return f.replicaFault(rng, checker.FaultStop, func(r *replica) string { return fmt.Sprintf("pid %d", r.current().Pid()) },
		func(r *replica) error { r.current().Signal(syscall.SIGSTOP); return nil },
		func(r *replica) error { r.current().Signal(syscall.SIGCONT); return nil })
}

// restartReplica: a graceful stop (SIGTERM), down for the fault's length.
func (f *faults) restartReplica(rng *rand.Rand, _ time.Duration) (checker.Record, func(), bool) {
	return f.replicaFault(rng, checker.FaultRestart, func(r *replica) string { return fmt.Sprintf("pid %d, SIGTERM", r.current().Pid()) },
		func(r *replica) error { f.w.stopReplica(r, syscall.SIGTERM); return nil },
		func(r *replica) error { return f.w.startReplica(r, 0) })
}

// clockOffset restarts a replica as skewcp with its own clock minutes off
// for the fault's length, then as itself again.
func (f *faults) clockOffset(rng *rand.Rand, _ time.Duration) (checker.Record, func(), bool) {
	skew := time.Duration(1+rng.IntN(10)) * time.Minute
	if rng.IntN(2) == 0 {
		skew = -skew
	}
	return f.replicaFault(rng, checker.FaultClockOffset, func(*replica) string { return "offset=" + skew.String() },
		func(r *replica) error { f.w.stopReplica(r, syscall.SIGTERM); return f.w.startReplica(r, skew) },
		func(r *replica) error { f.w.stopReplica(r, syscall.SIGTERM); return f.w.startReplica(r, 0) })
}

// postgresRestart stops the database (fast, or immediate: a crash as far
// as its data goes), keeps it down for the fault's length, starts it.
func (f *faults) postgresRestart(rng *rand.Rand, _ time.Duration) (checker.Record, func(), bool) {
	if !f.claim("global") {
		return checker.Record{}, nil, false
	}
	sig, how := syscall.SIGINT, "fast"
	if rng.IntN(2) == 0 {
		sig, how = syscall.SIGQUIT, "immediate"
	}
	pid := f.w.pg.pid()
	f.w.pg.stop(sig)
	f.w.process(checker.RolePostgres, checker.ProcessExit, "", "", pid, nil)
	rec := fault(checker.FaultPGRestart, checker.RolePostgres, how+" shutdown")
	return rec, func() {
		if err := f.w.pg.start(); err != nil {
			f.w.t.Errorf("start postgres again: %v", err)
		} else {
			f.w.process(checker.RolePostgres, checker.ProcessStart, "", "", f.w.pg.pid(), nil)
		}
		f.release("global")
	}, true
}
