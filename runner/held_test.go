package runner

import (
	"bytes"
	"runtime/pprof"
	"strings"
	"testing"
	"time"
)

// A held turn costs the daemon one goroutine of the runner's,
// the attempt's own, which watches the turn itself once it is accepted;
// no watcher of its own waits beside it. Counted in a goroutine profile of
// the real daemon holding held real turn children (silent, "hang").
func TestHeldTurnHasOneRunnerGoroutine(t *testing.T) {
	const held = 4
	c := newCP(t)
	for range held {
		c.enqueue("hang")
	}
	r := startDaemon(t, c, func(cfg *Config) { cfg.Capacity = held })
	waitFor(t, "every child to accept", 30*time.Second, func() bool { return r.logs.count(MsgTurnAccepted) == held })
	// The launch's watcher ends as the launch returns, just after the
	// accept record: allow it that moment.
	got, dump := attemptGoroutines()
	for deadline := time.Now().Add(5 * time.Second); got > held && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		got, dump = attemptGoroutines()
	}
	if got != held {
		t.Fatalf("%d goroutines of the runner's for %d held turns, want one each:\n%s", got, held, dump)
	}
}

// attemptGoroutines counts the goroutines that the runner's attempt code
// runs on: started by a function of package runner (the daemon's loops
// are started by a WaitGroup; the renewer's and the handover's goroutines,
// which call back into an attempt, by their own packages) and with a frame
// of an attempt's code. It returns them too, as the profile shows them.
func attemptGoroutines() (int, string) {
	var buf bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&buf, 2)
	const pkg = "github.com/runnerd/runnerd/runner."
	var n int
	var shown strings.Builder
	for _, g := range strings.Split(buf.String(), "\n\n") {
		createdByRunner := strings.Contains(g, "\ncreated by "+pkg)
		ofAttempt := strings.Contains(g, pkg+"(*attempt).") || strings.Contains(g, pkg+"(*Daemon).runAttempt") ||
			strings.Contains(g, pkg+"(*Daemon).superviseTurn") || strings.Contains(g, pkg+"(*Daemon).reattach")
		if createdByRunner && ofAttempt {
			n++
			shown.WriteString(g + "\n\n")
		}
	}
	return n, shown.String()
}
