package controlplane_test

import (
	"context"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/wire"
)

var attemptID = regexp.MustCompile(`att_[a-z0-9]+`)

// attemptsNamed lists the distinct attempt ids in a raw answer body.
func attemptsNamed(b []byte) []string {
	var ids []string
	for _, m := range attemptID.FindAll(b, -1) {
		if !slices.Contains(ids, string(m)) {
			ids = append(ids, string(m))
		}
	}
	slices.Sort(ids)
	return ids
}

// R20 over HTTP: after the reaper supersedes an attempt, the job view, its
// event feed and its admin page name that attempt only — nothing announces
// another one, the page says no later attempt has events — until a host
// claims the turn; the new attempt then appears with its own claimed event.
func TestSupersededJobViewAnnouncesNoOtherAttempt(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	hostB := f.addHost("host-b")
	a := f.turn()
	f.clock.Advance(controlplane.DefaultLeaseTTL + controlplane.DefaultReaperGrace + time.Second)
	f.srv.Sweep(ctx)

	for _, path := range []string{"/v1/jobs/" + a.JobID, "/v1/jobs/" + a.JobID + "/events", "/admin/jobs/" + a.JobID} {
		_, body := f.do(http.MethodGet, path, userToken, "")
		if got := attemptsNamed(body); !slices.Equal(got, []string{a.AttemptID}) {
			t.Fatalf("GET %s after the supersession names attempts %v, want only %s: %s", path, got, a.AttemptID, body)
		}
	}
	j := f.job(a.JobID)
	if len(j.Attempts) != 1 || j.Attempts[0].State != wire.AttemptSuperseded || j.State != wire.JobQueued || !hasEvent(j, "attempt_superseded") {
		t.Fatalf("job after the supersession: state %s, attempts %+v", j.State, j.Attempts)
	}

	_, page := f.do(http.MethodGet, "/admin/jobs/"+a.JobID, userToken, "")
	if !strings.Contains(string(page), "No later attempt of this job has any event.") {
		t.Fatalf("the job page before host-b's claim does not say that no later attempt has events:\n%s", page)
	}

	b, err := f.wc.Claim(ctx, hostB, wire.ClaimRequest{})
	if err != nil || b.JobID != a.JobID {
		t.Fatalf("host-b's claim: %+v, %v", b, err)
	}
	want := []string{a.AttemptID, b.AttemptID}
	slices.Sort(want)
	for _, path := range []string{"/v1/jobs/" + a.JobID, "/admin/jobs/" + a.JobID} {
		_, body := f.do(http.MethodGet, path, userToken, "")
		if got := attemptsNamed(body); !slices.Equal(got, want) {
			t.Fatalf("after host-b's claim GET %s names %v, want %v", path, got, want)
		}
	}
	j = f.job(a.JobID)
	var claimedB bool
	for _, e := range j.Events {
		claimedB = claimedB || (e.Type == "claimed" && e.AttemptID == b.AttemptID)
	}
	if len(j.Attempts) != 2 || !claimedB {
		t.Fatalf("the new attempt %s must come with its own claimed event: attempts %+v, events %+v", b.AttemptID, j.Attempts, j.Events)
	}
}
