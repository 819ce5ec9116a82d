package supervisor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnerd/runnerd/sandbox"
)

// jsonLog keeps a supervisor's records as JSON, as Main writes them.
type jsonLog struct {
	mu  sync.Mutex // guards buf: the supervisor's goroutines write, the test reads
	buf bytes.Buffer
}

func (l *jsonLog) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(b)
}

type timelineRecord struct {
	Msg        string `json:"msg"`
	Instance   string `json:"instance"`
	Generation uint64 `json:"generation"`
	PID        int    `json:"pid"`
	BootNS     int64  `json:"boottime_ns"`
	StartTicks int64  `json:"pid_start_ticks"`
	StopReason string `json:"stop_reason"`
	Failed     bool   `json:"failed"`
}

// timeline is every record of the agents' timeline so far, in order.
func (l *jsonLog) timeline(t *testing.T) []timelineRecord {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []timelineRecord
	for _, line := range strings.Split(strings.TrimSpace(l.buf.String()), "\n") {
		var r timelineRecord
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("record %q: %v", line, err)
		}
		switch r.Msg {
		case RecordAgentStarted, RecordAgentExited, RecordACPPromptSent, RecordACPPromptEnded:
			out = append(out, r)
		}
	}
	return out
}

// checkPair: start and end are of the activation act (its id begins with
// instance.generation.), of one pid, on CLOCK_BOOTTIME in order, and the
// start is no earlier than the pid's own start time.
func checkPair(t *testing.T, start, end timelineRecord, act string, pid int) {
	t.Helper()
	if !strings.HasPrefix(act, fmt.Sprintf("%s.%d.", start.Instance, start.Generation)) ||
		end.Instance != start.Instance || end.Generation != start.Generation {
		t.Fatalf("records %+v, %+v do not name activation %s", start, end, act)
	}
	if start.PID != pid || end.PID != pid {
		t.Fatalf("records %+v, %+v; want pid %d", start, end, pid)
	}
	if start.BootNS <= 0 || end.BootNS < start.BootNS {
		t.Fatalf("boottime_ns %d then %d", start.BootNS, end.BootNS)
	}
	if ticks := start.StartTicks * int64(10*time.Millisecond); start.StartTicks <= 0 || ticks > start.BootNS {
		t.Fatalf("pid_start_ticks %d (%d ns) against the record's boottime_ns %d", start.StartTicks, ticks, start.BootNS)
	}
}

// TestAgentTimelineRecords: the supervisor records each lines agent's
// start and exit, and each ACP turn's prompt sent and answer received,
// with the activation (instance and generation) they ran under, the
// agent's pid and CLOCK_BOOTTIME (issue 24 §7: the chaos checker judges
// overlap on these).
func TestAgentTimelineRecords(t *testing.T) {
	t.Run("lines", func(t *testing.T) {
		log := &jsonLog{}
		s := startServe(t, func(c *Config) { c.Logger = slog.New(slog.NewJSONHandler(log, nil)) })
		var acts []sandbox.Activation
		var pids []int
		for _, p := range []string{"one", "two"} {
			act, evs, _ := runTurn(t, s.c, p)
			acts, pids = append(acts, act), append(pids, eventField[int](t, evs[0], "pid"))
		}
		tl := log.timeline(t)
		if len(tl) != 4 || tl[0].Msg != RecordAgentStarted || tl[1].Msg != RecordAgentExited ||
			tl[2].Msg != RecordAgentStarted || tl[3].Msg != RecordAgentExited {
			t.Fatalf("timeline %+v", tl)
		}
		checkPair(t, tl[0], tl[1], acts[0].ID, pids[0])
		checkPair(t, tl[2], tl[3], acts[1].ID, pids[1])
		if tl[2].BootNS < tl[1].BootNS {
			t.Fatalf("the second agent started before the first exited: %+v", tl)
		}
	})
	t.Run("acp", func(t *testing.T) {
		log := &jsonLog{}
		s := startServe(t, func(c *Config) { c.Logger = slog.New(slog.NewJSONHandler(log, nil)) })
		agent := demoACP()
		p1, _, _ := acpRun(t, s.c, agent, "hello", sandbox.ACPOptions{})
		p2, _, res := acpRun(t, s.c, agent, "!error", sandbox.ACPOptions{})
		if res.Failure != sandbox.FailureACPError || p2.PID != p1.PID {
			t.Fatalf("second turn %+v on agent %d (the first's %d)", res, p2.PID, p1.PID)
		}
		tl := log.timeline(t)
		if len(tl) != 4 || tl[0].Msg != RecordACPPromptSent || tl[1].Msg != RecordACPPromptEnded ||
			tl[2].Msg != RecordACPPromptSent || tl[3].Msg != RecordACPPromptEnded {
			t.Fatalf("timeline %+v", tl)
		}
		if tl[1].StopReason != "end_turn" || tl[1].Failed || tl[3].StopReason != "" || !tl[3].Failed {
			t.Fatalf("answers %+v, %+v", tl[1], tl[3])
		}
		if tl[0].Generation == tl[2].Generation || tl[2].BootNS < tl[1].BootNS {
			t.Fatalf("two turns %+v", tl)
		}
		for _, r := range tl {
			if r.PID != p1.PID {
				t.Fatalf("record %+v; want the kept agent %d", r, p1.PID)
			}
		}
	})
}
