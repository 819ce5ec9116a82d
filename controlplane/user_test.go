package controlplane_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// Infrastructure words that owner-facing wording must not use (R32).
var jargon = []string{"lease", "attempt", "admi", "generation", "worker", "409", "LOST", "reaper", "supersed", "token", "runner"}

func plain(t *testing.T, what, s string) {
	t.Helper()
	if s == "" {
		t.Fatalf("%s is empty", what)
	}
	for _, w := range jargon {
		if strings.Contains(s, w) {
			t.Fatalf("%s %q uses infrastructure wording %q", what, s, w)
		}
	}
}

// A conversation whose retained session is gone is LOST (R31); a new
// message is refused with 409 conversation_lost in plain words, and stays
// refused (R32).
func TestLostConversationRefusesMessagesPlainly(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	c := f.turn()
	if _, err := f.wc.Admission(ctx, c.WorkerToken, c.JobID, wire.AdmissionRequest{AttemptRef: ref(c), ActivationID: "act-1"}); err != nil {
		t.Fatal(err)
	}
	fr, err := f.wc.Finish(ctx, c.WorkerToken, c.JobID, wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeFailed, Class: "workspace_missing", Unrecoverable: true})
	if err != nil || fr.ConversationState != wire.ConversationLost {
		t.Fatalf("finish of a turn whose session is gone: %+v, %v; want the conversation lost", fr, err)
	}
	path := "/v1/conversations/" + c.Turn.ConversationID + "/messages"
	for range 2 {
		raw := f.expect(http.MethodPost, path, userToken, `{"prompt": "are you there?"}`, http.StatusConflict, wire.CodeConversationLost)
		var eb wire.ErrorBody
		if err := json.Unmarshal(raw, &eb); err != nil {
			t.Fatal(err)
		}
		plain(t, "refusal message", eb.Message)
	}
	var cv wire.Conversation
	f.user(http.MethodGet, "/v1/conversations/"+c.Turn.ConversationID, nil, &cv)
	if cv.State != wire.ConversationLost {
		t.Fatalf("conversation state %q, want lost", cv.State)
	}
	plain(t, "lost_reason", cv.LostReason)
	// Nothing was queued by the refused messages.
	if _, err := f.wc.Claim(ctx, f.hostToken, wire.ClaimRequest{}); err != wire.ErrNoClaim {
		t.Fatalf("claim after refused messages: %v, want nothing to claim", err)
	}
}

// Cancelling a running job sets the flag that the next renewal answer
// carries, and the lease is kept (P7, R13); a queued job is cancelled at
// once and never claimed; an ended job answers 410.
func TestCancelReachesRenewal(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	c := f.turn()
	var j wire.Job
	f.user(http.MethodPost, "/v1/jobs/"+c.JobID+"/cancel", nil, &j)
	if !j.CancelRequested || j.State != wire.JobRunning {
		t.Fatalf("cancel of a running job: %+v", j)
	}
	rn, err := f.wc.Renew(ctx, c.WorkerToken, c.JobID, wire.RenewRequest{AttemptRef: ref(c)})
	if err != nil || !rn.CancelRequested {
		t.Fatalf("renew after cancel: %+v, %v; want the cancel flag", rn, err)
	}
	fr, err := f.wc.Finish(ctx, c.WorkerToken, c.JobID, wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeCancelled})
	if err != nil || fr.JobState != wire.JobCancelled {
		t.Fatalf("finish cancelled: %+v, %v", fr, err)
	}
	f.expect(http.MethodPost, "/v1/jobs/"+c.JobID+"/cancel", userToken, "", http.StatusGone, wire.CodeGone)

	queued := f.send(f.newConversation().ID, "never run")
	f.user(http.MethodPost, "/v1/jobs/"+queued.ID+"/cancel", nil, &j)
	if j.State != wire.JobCancelled {
		t.Fatalf("cancel of a queued job: state %q, want cancelled", j.State)
	}
	if _, err := f.wc.Claim(ctx, f.hostToken, wire.ClaimRequest{}); err != wire.ErrNoClaim {
		t.Fatalf("claim after cancelling the only queued job: %v, want nothing", err)
	}
	f.expect(http.MethodPost, "/v1/jobs/no-such-job/cancel", userToken, "", http.StatusNotFound, wire.CodeNotFound)
}

func TestUserAPIStatuses(t *testing.T) {
	f := newFixture(t)
	conv := f.newConversation()
	job := f.send(conv.ID, "hi")
	cases := []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"create: no agent command", "POST", "/v1/conversations", `{"image": "x"}`, 400, wire.CodeInvalid},
		{"create: empty program", "POST", "/v1/conversations", `{"image": "x", "agent_command": [""]}`, 400, wire.CodeInvalid},
		{"create: unknown field", "POST", "/v1/conversations", `{"agent_command": ["a"], "imagee": "x"}`, 400, wire.CodeUnknownField},
		{"create: malformed", "POST", "/v1/conversations", `{"agent_command": ["a"]`, 400, wire.CodeBadJSON},
		{"create: oversize", "POST", "/v1/conversations", `{"title": "` + strings.Repeat("x", wire.MaxBodyBytes) + `"}`, 400, wire.CodeBodyTooLarge},
		{"conversation: unknown", "GET", "/v1/conversations/nope", "", 404, wire.CodeNotFound},
		{"message: unknown conversation", "POST", "/v1/conversations/nope/messages", `{"prompt": "x"}`, 404, wire.CodeNotFound},
		{"message: empty prompt", "POST", "/v1/conversations/" + conv.ID + "/messages", `{"prompt": ""}`, 400, wire.CodeInvalid},
		{"message: unknown field", "POST", "/v1/conversations/" + conv.ID + "/messages", `{"prompt": "x", "p": 1}`, 400, wire.CodeUnknownField},
		{"message: trailing data", "POST", "/v1/conversations/" + conv.ID + "/messages", `{"prompt": "x"}]`, 400, wire.CodeBadJSON},
		{"job: unknown", "GET", "/v1/jobs/nope", "", 404, wire.CodeNotFound},
		{"events: unknown job", "GET", "/v1/jobs/nope/events", "", 404, wire.CodeNotFound},
		{"events: bad cursor", "GET", "/v1/jobs/" + job.ID + "/events?after=x", "", 400, wire.CodeInvalid},
		{"events: negative wait", "GET", "/v1/jobs/" + job.ID + "/events?wait_ms=-5", "", 400, wire.CodeInvalid},
		{"no such endpoint", "GET", "/v1/nothing", "", 404, wire.CodeNotFound},
		{"wrong method", "DELETE", "/v1/conversations", "", 405, wire.CodeMethodNotAllowed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f.expect(tc.method, tc.path, userToken, tc.body, tc.status, tc.code)
		})
	}

	var list wire.ConversationList
	f.user(http.MethodGet, "/v1/conversations", nil, &list)
	if len(list.Conversations) != 1 || list.Conversations[0].ID != conv.ID {
		t.Fatalf("conversation list %+v", list)
	}
	if job.ConversationID != conv.ID || job.Seq != 1 || job.State != wire.JobQueued {
		t.Fatalf("enqueued job %+v", job)
	}
	second := f.send(conv.ID, "and then")
	if second.Seq != 2 {
		t.Fatalf("second turn seq %d, want 2", second.Seq)
	}
	// A queued job's follow with no wait answers at once, not ended.
	var page wire.JobEventList
	f.user(http.MethodGet, "/v1/jobs/"+job.ID+"/events?after=0&wait_ms=0", nil, &page)
	if page.Ended || page.Events == nil {
		t.Fatalf("events of a queued job: %+v", page)
	}
}

func TestUserAPINeedsTheUserToken(t *testing.T) {
	f := newFixture(t)
	paths := []struct{ method, path string }{
		{"POST", "/v1/conversations"}, {"GET", "/v1/conversations"}, {"GET", "/v1/conversations/x"},
		{"POST", "/v1/conversations/x/messages"}, {"GET", "/v1/jobs/x"}, {"GET", "/v1/jobs/x/events"},
		{"POST", "/v1/jobs/x/cancel"}, {"GET", "/v1/admin/servers"}, {"GET", "/admin/servers"},
	}
	for _, p := range paths {
		t.Run(p.method+" "+p.path, func(t *testing.T) {
			f.expect(p.method, p.path, "", `{}`, http.StatusUnauthorized, wire.CodeUnauthorized)
			f.expect(p.method, p.path, "rdu_wrong", `{}`, http.StatusUnauthorized, wire.CodeUnauthorized)
			f.expect(p.method, p.path, f.hostToken, `{}`, http.StatusUnauthorized, wire.CodeUnauthorized)
		})
	}
	// A browser gets a Basic challenge on the admin page and is let in
	// with the user token as its password.
	resp, err := http.Get(f.url + "/admin/servers")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Basic ") {
		t.Fatalf("admin page without credentials: %d, challenge %q", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}
	req, _ := http.NewRequest(http.MethodGet, f.url+"/admin/servers", nil)
	req.SetBasicAuth("admin", userToken)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("admin page with Basic credentials: %d", resp.StatusCode)
	}
}

// Admin → Servers shows each host's last heartbeat, capacity, running
// turns, draining state and, beside the host, its launch error (R37).
func TestAdminServersShowLaunchError(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	odd := f.addHost(`<script>alert("x")</script>`)
	f.turn() // host-a runs one turn
	since := f.clock.Now().Add(-time.Minute)
	if _, err := f.wc.HostHeartbeat(ctx, f.hostToken, wire.HostHeartbeat{
		Capacity: 4, Running: 1, Draining: true, Version: "v9",
		LaunchError: &wire.LaunchError{Class: "spawn_failed", Consecutive: 3, Since: since},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.wc.HostHeartbeat(ctx, odd, wire.HostHeartbeat{Capacity: 1}); err != nil {
		t.Fatal(err)
	}
	var list wire.ServerList
	f.user(http.MethodGet, "/v1/admin/servers", nil, &list)
	var a *wire.Server
	for i := range list.Servers {
		if list.Servers[i].Name == "host-a" {
			a = &list.Servers[i]
		}
	}
	if len(list.Servers) != 2 || a == nil {
		t.Fatalf("servers %+v", list.Servers)
	}
	if a.Capacity != 4 || a.Running != 1 || !a.Draining || a.Version != "v9" || a.LastHeartbeat == nil ||
		a.LaunchError == nil || a.LaunchError.Class != "spawn_failed" || a.LaunchError.Consecutive != 3 {
		t.Fatalf("host-a as listed: %+v (launch error %+v)", a, a.LaunchError)
	}

	status, body := f.do(http.MethodGet, "/admin/servers", userToken, "")
	page := string(body)
	if status != http.StatusOK {
		t.Fatalf("admin page: %d", status)
	}
	row := page[strings.Index(page, "<td>host-a</td>"):]
	row = row[:strings.Index(row, "</tr>")]
	for _, want := range []string{"spawn_failed", "3 consecutive launch failure", "draining", "<td class=\"num\">1 / 4</td>", "v9"} {
		if !strings.Contains(row, want) {
			t.Fatalf("host-a's row lacks %q:\n%s", want, row)
		}
	}
	if strings.Contains(page, "<script>") || !strings.Contains(page, "&lt;script&gt;") {
		t.Fatalf("host name not escaped:\n%s", page)
	}
}

// User tokens live in the store: one created there is accepted at once,
// and once revoked it is refused at once, on the user API and the admin
// page alike, on both stores. Two servers on one PostgreSQL database share
// them (cmd/controlplane.TestUserTokensSharedByReplicas runs two replicas).
func TestUserTokensFromTheStore(t *testing.T) {
	for _, sc := range stores {
		t.Run(sc.name, func(t *testing.T) {
			f := newFixtureOn(t, sc.db(t))
			ctx := context.Background()
			tok := controlplane.NewToken(controlplane.UserTokenPrefix)
			ut, err := f.st.CreateUserToken(ctx, "second", controlplane.HashToken(tok), store.Audit{Actor: "test"}, f.clock.Now())
			if err != nil {
				t.Fatal(err)
			}
			f.expect("GET", "/v1/conversations", tok, "", http.StatusOK, "")
			f.expect("GET", "/admin/servers", tok, "", http.StatusOK, "")
			if _, err := f.st.RevokeUserToken(ctx, ut.ID, store.Audit{Actor: "test"}, f.clock.Now()); err != nil {
				t.Fatal(err)
			}
			f.expect("GET", "/v1/conversations", tok, "", http.StatusUnauthorized, wire.CodeUnauthorized)
			f.expect("POST", "/v1/conversations", tok, `{"image":"i","agent_command":["a"]}`, http.StatusUnauthorized, wire.CodeUnauthorized)
			f.expect("GET", "/admin/servers", tok, "", http.StatusUnauthorized, wire.CodeUnauthorized)
			f.expect("GET", "/v1/conversations", userToken, "", http.StatusOK, "")
			if strings.Contains(f.logs.String(), tok) {
				t.Fatal("a user token reached the log")
			}
		})
	}
}

// A path some route serves, asked with a method none of its routes takes,
// is 405 with the methods it does take in Allow and the documented error
// body; a path no route serves is 404 whatever the method. The catch-all
// route answered both 404.
func TestWrongMethodIsMethodNotAllowed(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		method, path, allow string
	}{
		{"DELETE", "/v1/conversations", "GET, HEAD, POST"},
		{"PUT", "/v1/conversations/conv_x", "GET, HEAD, DELETE"},
		{"GET", "/v1/jobs/job_x/cancel", "POST"},
		{"GET", wire.PathClaim, "POST"},
		{"DELETE", wire.AttemptPath("job_x", wire.OpFinish), "POST"},
		{"POST", "/v1/nothing", ""},
	} {
		req, err := http.NewRequest(tc.method, f.url+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+userToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want, wantCode := http.StatusMethodNotAllowed, wire.CodeMethodNotAllowed
		if tc.allow == "" {
			want, wantCode = http.StatusNotFound, wire.CodeNotFound
		}
		if resp.StatusCode != want || code(b) != wantCode || resp.Header.Get("Allow") != tc.allow {
			t.Errorf("%s %s: HTTP %d %q, Allow %q; want %d %q, Allow %q", tc.method, tc.path, resp.StatusCode, code(b), resp.Header.Get("Allow"), want, wantCode, tc.allow)
		}
	}
}
