package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/wire"
)

// Record names and keys the daemon benchmarks read from the daemon's
// JSON records (runner/records.go).
const (
	recTurnAccepted = "runnerd_turn_accepted"
	recReportSent   = "runnerd_report_sent"
)

// records reads the daemon's JSON records as they come: it counts the
// acknowledged terminal reports and keeps every claim → ACCEPT time.
type records struct {
	mu sync.Mutex // guards the fields below
	// partial is the start of a line not yet ended.
	partial []byte
	reports int
	accepts []float64 // since_claim_ms of each runnerd_turn_accepted
	// changed is closed and replaced at each acknowledged report.
	changed chan struct{}
}

func newRecords() *records { return &records{changed: make(chan struct{})} }

func (r *records) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.partial = append(r.partial, p...)
	for {
		i := bytes.IndexByte(r.partial, '\n')
		if i < 0 {
			break
		}
		r.line(r.partial[:i])
		r.partial = r.partial[i+1:]
	}
	return len(p), nil
}

func (r *records) line(b []byte) {
	var rec struct {
		Msg        string   `json:"msg"`
		SinceClaim *float64 `json:"since_claim_ms"`
	}
	if json.Unmarshal(b, &rec) != nil {
		return
	}
	switch rec.Msg {
	case recTurnAccepted:
		if rec.SinceClaim != nil {
			r.accepts = append(r.accepts, *rec.SinceClaim)
		}
	case recReportSent:
		r.reports++
		close(r.changed)
		r.changed = make(chan struct{})
	}
}

// mark is the number of reports and of ACCEPT times so far.
func (r *records) mark() (reports, accepts int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reports, len(r.accepts)
}

// acceptsSince returns the claim → ACCEPT times recorded after mark.
func (r *records) acceptsSince(from int) []float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.accepts[from:])
}

// await waits until reports terminal reports have been acknowledged.
func (r *records) await(ctx context.Context, reports int, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		n, changed := r.reports, r.changed
		r.mu.Unlock()
		if n >= reports {
			return nil
		}
		select {
		case <-changed:
		case <-deadline.C:
			return fmt.Errorf("%d of %d turns ended within %v", n, reports, timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// b3 runs B3 (whole turns through the daemon) on one real `runnerd run`
// with the process backend and the demo agent, served by the control plane
// in this process on SQLite.
//
// B3: conv conversations each run one turn first (their supervisors start
// then, untimed); then turns more each are queued at once and timed from
// the first enqueue to the last acknowledged finish, capacity 16. (B4 has
// a daemon of its own: b4.go.)
func (b *bench) b3(ctx context.Context) error {
	const capacity = 16
	conv, turns := b.size(32, 2), b.size(20, 2)
	bins, err := binaries(b.o.bin)
	if err != nil {
		return err
	}
	s, closeStore, err := b.openStore(ctx, sqliteFull)
	if err != nil {
		return err
	}
	defer closeStore()
	_, hostToken, err := newHost(ctx, s, "bench")
	if err != nil {
		return err
	}
	sv, err := serve(s, 8)
	if err != nil {
		return err
	}
	defer sv.Close()
	dir, err := os.MkdirTemp("", "runnerd-bench-daemon-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	tokenFile := filepath.Join(dir, "host-token")
	if err := os.WriteFile(tokenFile, []byte(hostToken+"\n"), 0o600); err != nil {
		return err
	}
	stateDir := filepath.Join(dir, "state")
	recs := newRecords()
	d, err := fleet.StartDaemon(ctx, fleet.DaemonConfig{
		Bin: bins.Runnerd, ControlPlaneURL: sv.URL, HostTokenFile: tokenFile, HostName: "bench",
		StateDir: stateDir, Capacity: capacity, Sandbox: sandbox.BackendProcess, Log: recs,
	})
	if err != nil {
		return err
	}
	defer func() {
		_ = d.Stop(syscall.SIGTERM, 30*time.Second)
		_, _ = fleet.StopProcs(5*time.Second, fleet.Under(stateDir))
	}()

	// Warm-up: one turn per conversation starts its supervisor.
	ids := make([]string, conv)
	for i := range ids {
		now, err := s.Now(ctx)
		if err != nil {
			return err
		}
		c, err := s.CreateConversation(ctx, wire.CreateConversationRequest{Title: fmt.Sprint("bench ", i), AgentCommand: []string{bins.DemoAgent}}, now)
		if err != nil {
			return err
		}
		ids[i] = c.ID
	}
	enqueue := func(id string) error {
		now, err := s.Now(ctx)
		if err != nil {
			return err
		}
		_, err = s.EnqueueTurn(ctx, id, "bench", now)
		return err
	}
	for _, id := range ids {
		if err := enqueue(id); err != nil {
			return err
		}
	}
	if err := recs.await(ctx, conv, 2*time.Minute); err != nil {
		return fmt.Errorf("warm-up: %w\n%s", err, tail(d.Output()))
	}
	done, _ := recs.mark()
	b.logf("B3: %d conversations warm, daemon pid %d", conv, d.Pid())

	{
		n := conv * turns
		cpuBefore, err := treeCPU(d.Pid(), stateDir, ids)
		if err != nil {
			return err
		}
		cpCPU := cpuClock()
		took, err := timed(func() error {
			for t := 0; t < turns; t++ {
				for _, id := range ids {
					if err := enqueue(id); err != nil {
						return err
					}
				}
			}
			return recs.await(ctx, done+n, 5*time.Minute)
		})
		if err != nil {
			return fmt.Errorf("%w\n%s", err, tail(d.Output()))
		}
		cpCPU = cpuClock() - cpCPU
		cpuAfter, err := treeCPU(d.Pid(), stateDir, ids)
		if err != nil {
			return err
		}
		done += n
		b.rep.add(row{ID: "B3", Store: sqliteFull, What: fmt.Sprintf("whole turns through the daemon, process backend, capacity %d", capacity),
			Value: rate(n, took), Unit: "turns/s",
			Detail: fmt.Sprintf("%d turns over %d conversations; per turn: daemon and turn children %s CPU, supervisors and agents %s, control plane %s",
				n, conv, perOp(cpuAfter.daemon-cpuBefore.daemon, n), perOp(cpuAfter.sandboxes-cpuBefore.sandboxes, n), perOp(cpCPU, n))})
	}

	return nil
}

// binaries are the two executables B3 and B4 run, from dir.
type bins struct{ Runnerd, DemoAgent string }

func binaries(dir string) (bins, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return bins{}, err
	}
	b := bins{Runnerd: filepath.Join(abs, "runnerd"), DemoAgent: filepath.Join(abs, "demoagent")}
	for _, p := range []string{b.Runnerd, b.DemoAgent} {
		if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return bins{}, fmt.Errorf("%s is not an executable (make build)", p)
		}
	}
	return b, nil
}

// quantile of sorted values, nearest rank.
func quantile(sorted []float64, q float64) float64 {
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// cpuTree is CPU time (user and system) of a daemon's process tree.
type cpuTree struct {
	daemon    time.Duration // the daemon and its waited-for children (turn children)
	sandboxes time.Duration // the supervisors and their waited-for children (agents)
}

func treeCPU(daemonPid int, stateDir string, convs []string) (cpuTree, error) {
	var t cpuTree
	var err error
	if t.daemon, err = procCPU(daemonPid); err != nil {
		return t, err
	}
	for _, id := range convs {
		pid, err := fleet.SupervisorPid(stateDir, id)
		if err != nil {
			return t, err
		}
		c, err := procCPU(pid)
		if err != nil {
			return t, err
		}
		t.sandboxes += c
	}
	return t, nil
}

// procCPU is utime+stime+cutime+cstime of /proc/pid/stat.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; fields after it follow ")".
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	var ticks int64
	for _, s := range f[11:15] { // fields 14–17
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / 100, nil // USER_HZ is 100 on Linux
}

func tail(s string) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-20):], "\n")
}
