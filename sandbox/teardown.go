package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/runnerd/runnerd/internal/atomicfile"
)

// DefaultTeardownBudget is how long a teardown (an idle or pressure
// eviction's Stop, a deletion's Remove) has to prove the sandbox's
// processes gone (S6): runnerd run --teardown-budget.
const DefaultTeardownBudget = 15 * time.Second

// ErrTeardownIncomplete: a teardown could not prove, within its budget,
// that the sandbox's processes are gone. A *TeardownIncomplete names what
// survived; check with errors.Is or errors.As.
var ErrTeardownIncomplete = errors.New("sandbox teardown incomplete")

// TeardownIncomplete is a Stop's or Remove's failure to prove the
// sandbox's processes gone within the budget (S6). The stop or removal
// itself went ahead: what is listed here outlived it.
type TeardownIncomplete struct {
	// PIDs are the process backend's survivors: the supervisor or
	// processes that descended from it when the teardown began, each held
	// by a pidfd (so a pid reused since is never named).
	PIDs []int
	// Container is the docker backend's container the engine still
	// reports running (a stop) or present (a removal).
	Container string
	Budget    time.Duration
	// Err is what the backend saw, if anything (the engine's stop failing).
	Err error
}

func (e *TeardownIncomplete) Error() string {
	var what []string
	if len(e.PIDs) > 0 {
		pids := make([]string, len(e.PIDs))
		for i, p := range e.PIDs {
			pids[i] = strconv.Itoa(p)
		}
		what = append(what, "pids "+strings.Join(pids, ","))
	}
	if e.Container != "" {
		what = append(what, fmt.Sprintf("container %.12s", e.Container))
	}
	msg := fmt.Sprintf("%v: %s still there after %v", ErrTeardownIncomplete, strings.Join(what, " and "), e.Budget)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

func (e *TeardownIncomplete) Unwrap() error { return ErrTeardownIncomplete }

// TeardownRecordsDir is, in a supervisor's state directory, where the
// supervisor leaves one file for each teardown of a stopped turn's agent
// tree (a cancel, a fence) it could not prove within its budget (S6),
// beside its own sandbox_teardown_incomplete record. The daemon collects
// and removes them (CollectTeardownRecords), so that its
// runnerd_sandbox_teardown_incomplete_total counts them too.
const TeardownRecordsDir = "teardown-incomplete"

// TeardownRecord is one such file: what the supervisor's record said.
type TeardownRecord struct {
	Teardown   string    `json:"teardown"` // cancel or fence, or the stop's own reason
	Generation uint64    `json:"generation"`
	AgentPID   int       `json:"agent_pid"`
	PIDs       []int     `json:"pids"` // what still ran at the budget's end
	BudgetMS   int64     `json:"budget_ms"`
	At         time.Time `json:"at"`
}

// WriteTeardownRecord leaves r in stateDir for the daemon, durably.
func WriteTeardownRecord(stateDir string, r TeardownRecord) error {
	dir := filepath.Join(stateDir, TeardownRecordsDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	name := fmt.Sprintf("%d-%d.json", r.Generation, r.At.UnixNano())
	return atomicfile.Write(filepath.Join(dir, name), b, 0o600)
}

// CollectTeardownRecords returns the records the supervisor of stateDir
// left and removes each one returned, so each is collected once. A file
// that cannot be read as a record (a write cut short leaves only a
// temporary file, never listed) is removed and counted as one whose
// teardown is "unknown". None is not an error.
func CollectTeardownRecords(stateDir string) ([]TeardownRecord, error) {
	dir := filepath.Join(stateDir, TeardownRecordsDir)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []TeardownRecord
	var errs []error
	for _, e := range ents {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		raw, err := os.ReadFile(path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var r TeardownRecord
		if json.Unmarshal(raw, &r) != nil || r.Teardown == "" {
			r = TeardownRecord{Teardown: "unknown"}
		}
		if err := os.Remove(path); err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, r)
	}
	return out, errors.Join(errs...)
}
