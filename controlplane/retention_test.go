package controlplane_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/wire"
)

// endedTurn runs one turn through the worker API that leaves detail behind
// (a runner event, a finish reason) and ends it; it returns the job id.
func endedTurn(t *testing.T, f *fixture) string {
	t.Helper()
	ctx := context.Background()
	c := f.turn()
	if _, err := f.wc.Events(ctx, c.WorkerToken, c.JobID, wire.EventsRequest{AttemptRef: ref(c),
		Events: []wire.Event{{Seq: 1, Type: "agent.output", Data: []byte(`{"text":"private output"}`)}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.wc.Finish(ctx, c.WorkerToken, c.JobID, wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeFailed,
		Class: "agent_exit", Reason: "private reason"}); err != nil {
		t.Fatal(err)
	}
	return c.JobID
}

// P8 over HTTP: past the retention window the reaper's sweep reclaims an
// ended job's detail, and GET /v1/jobs/{id} shows it: detail_reclaimed_at,
// no prompt, no runner payload or report text, the same states and
// timeline. One sweep inside the window changes nothing.
func TestJobReadShowsReclaimedDetail(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	id := endedTurn(t, f)
	_, body := f.do(http.MethodGet, "/v1/jobs/"+id, userToken, "")
	for _, want := range []string{`"prompt":"hello"`, "private output", "private reason"} {
		if !strings.Contains(string(body), want) {
			t.Fatalf("before retention the job lacks %s: %s", want, body)
		}
	}
	before := f.job(id)

	f.clock.Advance(controlplane.DefaultRetention - time.Hour)
	f.srv.Sweep(ctx)
	if j := f.job(id); j.DetailReclaimedAt != nil || j.Prompt != "hello" {
		t.Fatalf("reclaimed inside the window: %+v", j)
	}

	f.clock.Advance(2 * time.Hour)
	f.srv.Sweep(ctx)
	_, body = f.do(http.MethodGet, "/v1/jobs/"+id, userToken, "")
	for _, gone := range []string{`"prompt"`, "private output", "private reason"} {
		if strings.Contains(string(body), gone) {
			t.Fatalf("after retention the job still shows %s: %s", gone, body)
		}
	}
	j := f.job(id)
	if j.DetailReclaimedAt == nil || !j.DetailReclaimedAt.Equal(f.clock.Now()) {
		t.Fatalf("detail_reclaimed_at = %v, want %v", j.DetailReclaimedAt, f.clock.Now())
	}
	if j.State != before.State || j.Outcome != before.Outcome || j.AttemptCount != before.AttemptCount ||
		len(j.Attempts) != 1 || j.Attempts[0].State != before.Attempts[0].State || len(j.Events) != len(before.Events) {
		t.Fatalf("retention changed the job: %+v\nwas %+v", j, before)
	}
	for i, e := range j.Events {
		if e.Type != before.Events[i].Type || !e.Time.Equal(before.Events[i].Time) {
			t.Fatalf("event %d is %s at %v, was %s at %v", i, e.Type, e.Time, before.Events[i].Type, before.Events[i].Time)
		}
	}
	if !strings.Contains(f.logs.String(), `"msg":"controlplane_detail_reclaimed"`) {
		t.Fatalf("no controlplane_detail_reclaimed record in:\n%s", f.logs.String())
	}
}

// A negative Retention (--retention 0) never reclaims.
func TestRetentionDisabled(t *testing.T) {
	f := newFixture(t)
	clk := f.clock
	// A second server on the same store: only its sweep runs.
	srv := controlplane.New(controlplane.Config{Store: f.st, Logger: slog.New(slog.DiscardHandler), Now: clk.Now, Retention: -1})
	id := endedTurn(t, f)
	clk.Advance(10 * controlplane.DefaultRetention)
	srv.Sweep(context.Background())
	if j := f.job(id); j.DetailReclaimedAt != nil || j.Prompt != "hello" {
		t.Fatalf("reclaimed with retention disabled: %+v", j)
	}
}
