package runner

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// These tests run the whole daemon with real turn children (fakeTurn) and
// look at its spare: the child started before any claim.

// waitSpare waits until a spare other than the processes of not waits,
// and returns its pid.
func waitSpare(t *testing.T, d *Daemon, not ...int) int {
	t.Helper()
	var pid int
	waitFor(t, "a spare turn child", 15*time.Second, func() bool {
		d.spare.mu.Lock()
		defer d.spare.mu.Unlock()
		if d.spare.phase != spareWaiting {
			return false
		}
		pid = d.spare.child.PID()
		for _, n := range not {
			if pid == n {
				return false
			}
		}
		return true
	})
	return pid
}

// acceptedPid is the pid of the runnerd_turn_accepted record of job.
func acceptedPid(t *testing.T, logs *logBuf, job string) int {
	t.Helper()
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, `"msg":"`+MsgTurnAccepted+`"`) && strings.Contains(line, `"job_id":"`+job+`"`) {
			i := strings.Index(line, `"pid":`)
			if i < 0 {
				break
			}
			rest := line[i+len(`"pid":`):]
			n, err := strconv.Atoi(rest[:strings.IndexAny(rest, ",}")])
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s record of job %s:\n%s", MsgTurnAccepted, job, logs)
	return 0
}

func spareCount(t *testing.T, d *Daemon, end string) float64 {
	t.Helper()
	var m dto.Metric
	if err := d.m.SpareChildren.WithLabelValues(end).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// gauge is the value of a gauge the daemon's state collector reports.
func gauge(t *testing.T, d *Daemon, name string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(stateCollector{d.m})
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no %s series", name)
	return 0
}

// A spare waits before any claim, takes no slot, and the next claim's
// payload goes to it; after that ACCEPT the next spare starts.
func TestSpareTakesTheNextClaim(t *testing.T) {
	c := newCP(t)
	r := startDaemon(t, c, nil) // capacity 1
	spare := waitSpare(t, r.d)
	if got := gauge(t, r.d, metricSpareReady); got != 1 {
		t.Errorf("%s = %v with a spare waiting", metricSpareReady, got)
	}
	// It takes no slot: the long poll in flight asks for every one, and
	// nothing else is busy.
	waitFor(t, "a claim asking for the whole capacity", 10*time.Second, func() bool {
		r.d.mu.Lock()
		defer r.d.mu.Unlock()
		return r.d.claiming == r.d.cfg.Capacity && r.d.busy == r.d.claiming
	})
	j := c.enqueue("result")
	waitFor(t, "the job to end", 15*time.Second, ended(c, j.ID))
	if got := acceptedPid(t, r.logs, j.ID); got != spare {
		t.Fatalf("the turn was accepted by pid %d, the spare was %d", got, spare)
	}
	next := waitSpare(t, r.d, spare)
	if got := spareCount(t, r.d, spareHanded); got != 1 {
		t.Errorf("spares handed = %v", got)
	}
	j2 := c.enqueue("result")
	waitFor(t, "the second job to end", 15*time.Second, ended(c, j2.ID))
	if got := acceptedPid(t, r.logs, j2.ID); got != next {
		t.Fatalf("the second turn was accepted by pid %d, the next spare was %d", got, next)
	}
}

// R33: a spare killed before any payload was handed nothing. The claim
// that finds it dead gets a freshly started child, nothing is released,
// and the spare is recorded as discarded (exited).
func TestSpareKilledBeforePayloadReleasesNothing(t *testing.T) {
	c := newCP(t)
	r := startDaemon(t, c, nil)
	spare := waitSpare(t, r.d)
	if err := syscall.Kill(spare, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the killed spare to be a zombie", 10*time.Second, func() bool { return fleet.Zombie(spare) })

	j := c.enqueue("result")
	waitFor(t, "the job to end", 15*time.Second, ended(c, j.ID))
	got := c.job(j.ID)
	if got.State != wire.JobFailed || len(got.Attempts) != 1 || got.ReleaseCount != 0 || r.logs.has(MsgTurnReleased) {
		t.Fatalf("job %s, %d attempts, %d releases: the dead spare must concern no claim\n%s", got.State, len(got.Attempts), got.ReleaseCount, r.logs)
	}
	pid := acceptedPid(t, r.logs, j.ID)
	if pid == spare {
		t.Fatalf("the turn was accepted by the killed spare's pid %d", pid)
	}
	waitFor(t, "the discard record", 5*time.Second, func() bool {
		return strings.Contains(r.logs.String(), `"msg":"runnerd_spare_discarded","reason":"exited","pid":`+strconv.Itoa(spare))
	})
	if got := spareCount(t, r.d, spareExited); got != 1 {
		t.Errorf("spares exited = %v", got)
	}
	if got := spareCount(t, r.d, spareHanded); got != 0 {
		t.Errorf("spares handed = %v: the dead one was handed a claim", got)
	}
	// The next claim gets a fresh spare, started after that ACCEPT.
	next := waitSpare(t, r.d, spare, pid)
	j2 := c.enqueue("result")
	waitFor(t, "the second job to end", 15*time.Second, ended(c, j2.ID))
	if got := acceptedPid(t, r.logs, j2.ID); got != next {
		t.Fatalf("the second turn was accepted by pid %d, the fresh spare was %d", got, next)
	}
}

// R33: a spare that dies after its payload and before ACCEPT closed its
// descriptor without accepting: the claim is released as declined:closed,
// like any child's.
func TestSpareDeadAfterPayloadIsClosedWithoutAccepting(t *testing.T) {
	c := newCP(t)
	r := startDaemon(t, c, func(cfg *Config) { cfg.LaunchFailures = 100 })
	spare := waitSpare(t, r.d)
	j := c.enqueue("die")
	waitFor(t, "a released attempt", 15*time.Second, func() bool { return c.job(j.ID).ReleaseCount >= 1 })
	got := c.job(j.ID)
	if got.Attempts[0].State != wire.AttemptReleased || got.ReleaseClass != "declined:"+"closed" {
		t.Fatalf("attempt %s, release class %q\n%s", got.Attempts[0].State, got.ReleaseClass, r.logs)
	}
	if got := spareCount(t, r.d, spareHanded); got < 1 {
		t.Fatalf("spares handed = %v: the payload did not go to the spare", got)
	}
	waitFor(t, "the spare that died to be reaped", 10*time.Second, func() bool { return !fleet.Alive(spare) })
	if r.logs.has(MsgTurnAccepted) {
		t.Fatal("a turn was accepted")
	}
	if _, err := c.st.CancelJob(context.Background(), j.ID, c.now()); err != nil {
		t.Fatal(err)
	}
}

// A spare started from an executable that an upgrade has since replaced
// is discarded unused (outdated); the claim's child is started from the
// new file, and so is the next spare.
func TestUpgradeDiscardsTheOldSpare(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "runnerd")
	install := func() {
		t.Helper()
		tmp := path + ".new"
		if err := copyFile(exe, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil { // as a package manager replaces it
			t.Fatal(err)
		}
	}
	install()
	c := newCP(t)
	r := startDaemon(t, c, func(cfg *Config) { cfg.Executable = path })
	old := waitSpare(t, r.d)
	install()

	j := c.enqueue("result")
	waitFor(t, "the job to end", 15*time.Second, ended(c, j.ID))
	got := c.job(j.ID)
	if got.State != wire.JobFailed || got.ReleaseCount != 0 {
		t.Fatalf("job %s, %d releases", got.State, got.ReleaseCount)
	}
	if pid := acceptedPid(t, r.logs, j.ID); pid == old {
		t.Fatal("the turn went to the spare of the replaced executable")
	}
	waitFor(t, "the outdated spare's discard record", 5*time.Second, func() bool {
		return strings.Contains(r.logs.String(), `"msg":"runnerd_spare_discarded","reason":"outdated","pid":`+strconv.Itoa(old))
	})
	waitFor(t, "the outdated spare to be gone", 10*time.Second, func() bool { return !fleet.Alive(old) })
	next := waitSpare(t, r.d, old)
	target, err := os.Readlink("/proc/" + strconv.Itoa(next) + "/exe")
	if err != nil {
		t.Fatal(err)
	}
	if target != path {
		t.Fatalf("the next spare runs %q, want the new %q", target, path)
	}
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
