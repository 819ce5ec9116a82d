package sandbox

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
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
