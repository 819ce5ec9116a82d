package chaos

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/integration/chaos/checker"
)

// reportSection is the section of docs/reliability.md the long run
// rewrites (between checker.SectionBegin and SectionEnd).
const reportSection = "long"

// judge hands the history to the checker, prints its table with the seed
// and the fault mix, writes it to CHAOS_REPORT for a long run, and fails
// on any violation (an avoidable LOST is one).
func judge(t *testing.T, c campaign, w *world, took time.Duration, recs []checker.Record) checker.Report {
	t.Helper()
	rep := checker.Check(recs)
	run := checker.Run{
		Seed: int64(c.seed), Turns: c.turns, Hosts: len(w.hosts), Replicas: len(w.replicas),
		Duration: took, Date: time.Now(), Machine: machine(), Build: c.build,
		Command: fmt.Sprintf("make chaos SEED=%d TURNS=%d", c.seed, c.turns),
	}
	md := rep.Markdown(run)
	t.Logf("chaos: seed %d\n%s", c.seed, md)
	if path := os.Getenv(envReport); path != "" && c.long && c.build == "" {
		if err := checker.UpdateSection(path, reportSection, md); err != nil {
			t.Errorf("write the table: %v", err)
		} else {
			t.Logf("chaos: table written to %s", path)
		}
	}
	if c.build == "" && !rep.Clean() {
		t.Errorf("chaos seed %d: the checker found violations (history %s):\n%s", c.seed,
			filepath.Join(w.dir, "history.jsonl"), rep.Summary())
	}
	return rep
}

// machine says where the figures come from: cores and the load average.
func machine() string {
	load := "?"
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 3 {
			load = strings.Join(f[:3], " ")
		}
	}
	return fmt.Sprintf("%d cores, load average %s at the end", runtime.NumCPU(), load)
}
