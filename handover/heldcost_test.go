package handover

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// procStatus reads the Threads and VmRSS (KB) lines of /proc/<pid>/status.
func procStatus(pid string) (threads, rssKB int) {
	f, err := os.Open("/proc/" + pid + "/status")
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		fields := strings.Fields(v)
		if len(fields) == 0 {
			continue
		}
		n, _ := strconv.Atoi(fields[0])
		switch k {
		case "Threads":
			threads = n
		case "VmRSS":
			rssKB = n
		}
	}
	return threads, rssKB
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// parkedGoroutines counts the goroutines that are parked (not running,
// runnable or in a system call): those a held turn keeps, without the ones
// about to end.
func parkedGoroutines() int {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	parked := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		head, _, _ := strings.Cut(g, "\n") // goroutine 7 [IO wait, 2 minutes]:
		_, st, ok := strings.Cut(head, " [")
		st, _, _ = strings.Cut(st, "]")
		st, _, _ = strings.Cut(st, ",")
		if ok && st != "running" && st != "runnable" && st != "syscall" {
			parked++
		}
	}
	return parked
}

// TestHeldTurnGoroutines: a held, silent turn keeps at most
// two goroutines of the handover layer: its supervisor, and the one that
// reads its frames and waits for its exit together (three before they were
// merged: a reader and an exit wait).
func TestHeldTurnGoroutines(t *testing.T) {
	const n = 10
	cfg := testConfig(t, "hang-accepted")
	cfg.StopGrace, cfg.KillGrace = 50*time.Millisecond, 50*time.Millisecond
	before := parkedGoroutines()
	turns := make([]*Turn, 0, n)
	defer func() {
		for _, tr := range turns {
			tr.Stop()
		}
		for _, tr := range turns {
			tr.Wait()
		}
	}()
	for range n {
		tr, err := Launch(t.Context(), cfg, testPayload())
		if err != nil {
			t.Fatal(err)
		}
		turns = append(turns, tr)
	}
	held := parkedGoroutines() - before
	t.Logf("%d held turns: %d parked goroutines more (%.1f per turn)", n, held, float64(held)/n)
	if held > 2*n {
		t.Fatalf("%d held turns keep %d goroutines parked, want at most 2 per turn", n, held)
	}
}

// TestHeldTurnCost measures what the parent (the daemon's handover layer)
// pays per held, silent turn: OS threads, resident memory and CPU while the
// turns are held, with RUNNERD_MEASURE_HELD_TURNS children that accepted
// and say nothing. It is a measurement, run by hand; without
// the variable it is skipped.
func TestHeldTurnCost(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("RUNNERD_MEASURE_HELD_TURNS"))
	if n <= 0 {
		t.Skip("set RUNNERD_MEASURE_HELD_TURNS to measure")
	}
	self := strconv.Itoa(os.Getpid())
	cfg := testConfig(t, "hang-accepted")
	cfg.Stderr = nil
	cfg.StopGrace, cfg.KillGrace = 100*time.Millisecond, 100*time.Millisecond
	thr0, rss0 := procStatus(self)
	turns := make([]*Turn, 0, n)
	defer func() {
		for _, tr := range turns {
			tr.Stop()
		}
		for _, tr := range turns {
			tr.Wait()
		}
	}()
	start := time.Now()
	for range n {
		tr, err := Launch(t.Context(), cfg, testPayload())
		if err != nil {
			t.Fatal(err)
		}
		turns = append(turns, tr)
	}
	launched := time.Since(start)
	time.Sleep(2 * time.Second) // settle: a measurement, not a test of behaviour
	thr1, rss1 := procStatus(self)
	gor := parkedGoroutines()
	cpu0 := time.Now()
	c0 := cpuTime()
	time.Sleep(10 * time.Second)
	held := cpuTime() - c0
	wall := time.Since(cpu0)
	childThreads, childRSS := 0, 0
	for _, tr := range turns {
		th, r := procStatus(strconv.Itoa(tr.PID()))
		childThreads += th
		childRSS += r
	}
	t.Logf("held turns: %d (launched in %v)", n, launched.Round(time.Millisecond))
	t.Logf("parent threads: %d before, %d held (%.2f per turn)", thr0, thr1, float64(thr1-thr0)/float64(n))
	t.Logf("parent goroutines parked while held: %d (%.2f per turn)", gor, float64(gor)/float64(n))
	t.Logf("parent RSS: %d KB before, %d KB held (%.1f KB per turn)", rss0, rss1, float64(rss1-rss0)/float64(n))
	t.Logf("parent CPU while held: %v over %v (%.3f ms/s, %.4f ms/s per turn)", held, wall.Round(time.Millisecond),
		float64(held.Microseconds())/1000/wall.Seconds(), float64(held.Microseconds())/1000/wall.Seconds()/float64(n))
	t.Logf("children: %d threads (%.1f per turn), %d KB RSS (%.0f KB per turn)", childThreads, float64(childThreads)/float64(n),
		childRSS, float64(childRSS)/float64(n))
}
