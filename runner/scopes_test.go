package runner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// fakeScopes stands in for systemd's transient scopes (internal/sdscope):
// the real manager needs a systemd as PID 1, which
// integration.TestSystemdRestartKeepsScopes has.
// Place tells called and waits for release, so that the test can look at
// the daemon while the child is being placed.
type fakeScopes struct {
	err     error
	called  chan placement
	release chan struct{}

	mu     sync.Mutex // guards placed
	placed []placement
}

type placement struct {
	pid  int
	unit string
}

func (f *fakeScopes) Place(_ context.Context, pid int, unit string) error {
	p := placement{pid: pid, unit: unit}
	f.mu.Lock()
	f.placed = append(f.placed, p)
	f.mu.Unlock()
	f.called <- p
	<-f.release
	return f.err
}

func (f *fakeScopes) Unit(job, attempt string) string {
	return "turn-" + job + "-" + attempt + ".scope"
}

func (f *fakeScopes) Class(err error) string {
	if errors.Is(err, errRefused) {
		return "access_denied"
	}
	return "bus_error"
}

func (f *fakeScopes) placements() []placement {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]placement(nil), f.placed...)
}

var errRefused = errors.New("refused")

// parentOf is pid's parent from /proc, 0 if it cannot be read.
func parentOf(pid int) int {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ppid ...: comm may hold spaces, so count from ')'.
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

// Each turn child is handed to Scopes once it exists and before it
// accepts (it has not had its payload yet), under the attempt's unit name;
// the acceptance record names the scope. A refused placement is one
// record with its class and the turn runs on where it is; with no Scopes
// the start record says so and why.
func TestTurnScopes(t *testing.T) {
	for _, tc := range []struct {
		name      string
		scopes    bool
		err       error
		mechanism string
		class     string // of runnerd_turn_scope_failed; "" for none
	}{
		{name: "placed", scopes: true, mechanism: `"mechanism":"systemd_scope"`},
		{name: "refused", scopes: true, err: errRefused, mechanism: `"mechanism":"systemd_scope"`, class: "access_denied"},
		{name: "none", mechanism: `"mechanism":"none","reason":"not_a_systemd_service"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCP(t)
			j := c.enqueue("result")
			var fs *fakeScopes
			r := startDaemon(t, c, func(cfg *Config) {
				if tc.scopes {
					fs = &fakeScopes{err: tc.err, called: make(chan placement, 1), release: make(chan struct{})}
					cfg.Scopes = fs
				} else {
					cfg.ScopesOff = "not_a_systemd_service"
				}
			})
			if fs != nil {
				select {
				case p := <-fs.called:
					// The child exists, ours, and has not accepted: it waits
					// for its payload until the placement is done.
					if parentOf(p.pid) != os.Getpid() {
						t.Errorf("placed pid %d is not a child of the daemon", p.pid)
					}
					if r.logs.has(MsgTurnAccepted) {
						t.Errorf("the turn was accepted before its child was placed")
					}
				case <-time.After(15 * time.Second):
					t.Fatal("no turn child was placed")
				}
				close(fs.release)
			}
			waitFor(t, "the job to end", 15*time.Second, ended(c, j.ID))
			got := c.job(j.ID)
			if got.State != wire.JobFailed || len(got.Attempts) != 1 || got.Attempts[0].Outcome != wire.OutcomeFailed {
				t.Fatalf("job %s, attempts %+v: the scope must not change the turn\n%s", got.State, got.Attempts, r.logs)
			}
			logs := r.logs.String()
			if n := r.logs.count(MsgTurnScopes); n != 1 || !strings.Contains(logs, `"msg":"`+MsgTurnScopes+`",`+tc.mechanism) {
				t.Errorf("want one %s record with %s:\n%s", MsgTurnScopes, tc.mechanism, logs)
			}
			wantScope := ""
			if fs != nil {
				ps := fs.placements()
				unit := fs.Unit(j.ID, got.Attempts[0].ID)
				if len(ps) != 1 || ps[0].unit != unit {
					t.Fatalf("placements %+v, want one under %s", ps, unit)
				}
				if !strings.Contains(logs, fmt.Sprintf(`"msg":"%s","job_id":"%s","attempt_id":"%s","pid":%d,`, MsgTurnAccepted, j.ID, got.Attempts[0].ID, ps[0].pid)) {
					t.Errorf("the accepted child is not the placed pid %d:\n%s", ps[0].pid, logs)
				}
				if tc.err == nil {
					wantScope = unit
				}
			}
			if !strings.Contains(logs, `"scope":"`+wantScope+`"}`) {
				t.Errorf("the acceptance record does not name scope %q:\n%s", wantScope, logs)
			}
			failed := `"msg":"` + MsgTurnScopeFailed + `","job_id":"` + j.ID
			switch {
			case tc.class == "" && r.logs.has(MsgTurnScopeFailed):
				t.Errorf("a %s record for a placed child:\n%s", MsgTurnScopeFailed, logs)
			case tc.class != "" && (r.logs.count(MsgTurnScopeFailed) != 1 || !strings.Contains(logs, failed) || !strings.Contains(logs, `"class":"`+tc.class+`"`)):
				t.Errorf("want one %s record with class %s:\n%s", MsgTurnScopeFailed, tc.class, logs)
			}
		})
	}
}
