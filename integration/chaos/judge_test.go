package chaos

import (
	"testing"

	"github.com/runnerd/runnerd/integration/chaos/checker"
)

// judge hands the history to the checker. (Until the checker's Check
// lands, it only counts the records.)
func judge(t *testing.T, c campaign, mix string, recs []checker.Record) {
	counts := map[checker.Kind]int{}
	for _, r := range recs {
		counts[r.Kind]++
	}
	t.Logf("chaos: seed %d records %v; faults %s", c.seed, counts, mix)
}
