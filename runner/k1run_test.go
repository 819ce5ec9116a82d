package runner

import (
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// K1 on the first run, not after a restart: the whole daemon with real turn
// children against the real control plane, a fault proxy in front of it
// answering 500, then 429 with Retry-After: 1, then 503 to the terminal
// report — the finish of a turn whose child sent its RESULT, and the
// release of a turn whose child declined. The report arrives, at least the
// second the 429 asked for after it, the job ends as the turn did, and the
// attempt file is removed only then.
func TestK1FirstRunReportSurvivesTransientAnswers(t *testing.T) {
	tests := []struct {
		prompt string
		op     string
		check  func(t *testing.T, j wire.Job)
	}{
		{"result", wire.OpFinish, func(t *testing.T, j wire.Job) {
			if j.State != wire.JobFailed || j.Attempts[0].Outcome != wire.OutcomeFailed {
				t.Errorf("job %s, attempts %+v; want failed as the child said", j.State, j.Attempts)
			}
		}},
		{"decline", wire.OpRelease, func(t *testing.T, j wire.Job) {
			if j.Attempts[0].State != wire.AttemptReleased {
				t.Errorf("attempts %+v; want the first released", j.Attempts)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.op, func(t *testing.T) {
			c := newCP(t)
			start := time.Now()
			proxy := &faultProxy{next: c.srv.Handler(), start: start,
				plan: map[string][]answer{}, always: map[string]answer{}, tries: map[string][]time.Duration{}}
			proxy.set(tt.op, []answer{{status: 500}, {status: 429, retryAfter: "1"}, {status: 503}}, nil)
			front := httptest.NewServer(proxy)
			t.Cleanup(front.Close)
			j := c.enqueue(tt.prompt)
			r := startDaemon(t, c, func(cfg *Config) { cfg.ControlPlaneURL = front.URL })
			waitFor(t, "the report to arrive", 20*time.Second, func() bool {
				tries := proxy.triesOf(tt.op, start)
				return len(tries) >= 4 && r.logs.has(MsgReportSent)
			})
			tries := proxy.triesOf(tt.op, start)
			if gap := tries[2] - tries[1]; gap < time.Second {
				t.Errorf("the try after the 429 came %v after it, want at least its Retry-After (1s)", gap)
			}
			tt.check(t, c.job(j.ID))
			if got := statusesOf(r.logs, "agent_control_failure", tt.op); !slices.Equal(got, []int{500, 429, 503}) {
				t.Errorf("%s failure records %v, want 500, 429, 503", tt.op, got)
			}
			if r.logs.has(MsgReportRefused) {
				t.Errorf("a transient answer was taken for a refusal")
			}
			waitFor(t, "the attempt to be forgotten", 5*time.Second, func() bool { return persisted(r.d) == 0 })
			r.logs.noSecrets(t, c.hostToken)
		})
	}
}
