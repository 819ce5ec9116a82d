package controlplane_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/runnerd/runnerd/wire"
)

// GET /v1/jobs lists the jobs its filters select, newest first, a page at
// a time: following next_cursor lists every job once; a misspelt filter,
// a bad value or a forged cursor is 400 naming what is wrong, never a
// silent "all jobs"; a host token is refused like on every user call.
func TestListJobsAPI(t *testing.T) {
	f := newFixture(t)
	c1, c2 := f.newConversation(), f.newConversation()
	j1 := f.send(c1.ID, "one")
	j2 := f.send(c2.ID, "two")
	j3 := f.send(c1.ID, "three")
	claim := f.claim() // j1 runs on host-a
	if claim.JobID != j1.ID {
		t.Fatalf("claimed %s, want %s", claim.JobID, j1.ID)
	}
	f.user(http.MethodPost, "/v1/jobs/"+j2.ID+"/cancel", nil, nil)

	list := func(query string) wire.JobList {
		t.Helper()
		status, b := f.do(http.MethodGet, "/v1/jobs"+query, userToken, "")
		if status != http.StatusOK {
			t.Fatalf("GET /v1/jobs%s: HTTP %d %s", query, status, b)
		}
		var l wire.JobList
		if err := json.Unmarshal(b, &l); err != nil {
			t.Fatal(err)
		}
		return l
	}
	ids := func(l wire.JobList) []string {
		var out []string
		for _, j := range l.Jobs {
			out = append(out, j.ID)
		}
		return out
	}
	for _, tc := range []struct {
		query string
		want  []string
	}{
		{"", []string{j3.ID, j2.ID, j1.ID}},
		{"?state=running", []string{j1.ID}},
		{"?state=cancelled&outcome=cancelled", []string{j2.ID}},
		{"?conversation=" + c1.ID, []string{j3.ID, j1.ID}},
		{"?host=host-a", []string{j1.ID}},
		{"?since=" + url.QueryEscape(j1.CreatedAt.Format("2006-01-02T15:04:05.999999999Z07:00")), []string{j3.ID, j2.ID, j1.ID}},
		{"?class=agent_exit", nil},
	} {
		if got := ids(list(tc.query)); !slices.Equal(got, tc.want) {
			t.Errorf("GET /v1/jobs%s = %v, want %v", tc.query, got, tc.want)
		}
	}
	if l := list(""); len(l.Jobs) > 0 && len(l.Jobs[0].Events) != 0 {
		t.Errorf("a listed job carries %d events; they are its own page's", len(l.Jobs[0].Events))
	}
	if l := list("?class=nothing_like_it"); l.Jobs == nil {
		t.Error(`an empty page has "jobs": null, want []`)
	}

	var paged []string
	cursor := ""
	for range 4 {
		q := "?limit=2"
		if cursor != "" {
			q += "&cursor=" + url.QueryEscape(cursor)
		}
		l := list(q)
		paged = append(paged, ids(l)...)
		if cursor = l.NextCursor; cursor == "" {
			break
		}
	}
	if want := []string{j3.ID, j2.ID, j1.ID}; !slices.Equal(paged, want) || cursor != "" {
		t.Errorf("pages of two: %v (cursor %q after the last), want %v", paged, cursor, want)
	}

	for _, tc := range []struct{ query, names string }{
		{"?stat=running", "stat"},
		{"?state=lost", "state"},
		{"?outcome=ok", "outcome"},
		{"?class=a%25b", "class"},
		{"?since=yesterday", "since"},
		{"?limit=-1", "limit"},
		{"?limit=100000", "limit"},
		{"?cursor=123", "cursor"},
		{"?cursor=jcx", "cursor"},
	} {
		b := f.expect(http.MethodGet, "/v1/jobs"+tc.query, userToken, "", http.StatusBadRequest, wire.CodeInvalid)
		var eb wire.ErrorBody
		if err := json.Unmarshal(b, &eb); err != nil || !strings.Contains(eb.Message, tc.names) {
			t.Errorf("GET /v1/jobs%s: message %q does not name %s", tc.query, eb.Message, tc.names)
		}
	}
	f.expect(http.MethodGet, "/v1/jobs", f.hostToken, "", http.StatusUnauthorized, wire.CodeUnauthorized)
	if status, _ := f.do(http.MethodPost, "/v1/jobs", userToken, "{}"); status != http.StatusMethodNotAllowed {
		t.Errorf("POST /v1/jobs: HTTP %d, want 405", status)
	}
}
