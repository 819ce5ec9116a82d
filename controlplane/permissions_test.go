package controlplane_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/runnerd/runnerd/wire"
)

// permissionTurn claims a turn of a new ACP conversation under policy and
// uploads, as its runner would, a permission_requested event of request
// id with the options allow and reject.
func permissionTurn(f *fixture, policy, id string) wire.Claim {
	f.t.Helper()
	var c wire.Conversation
	f.user(http.MethodPost, "/v1/conversations", wire.CreateConversationRequest{Image: "i", AgentCommand: []string{"agent"},
		AgentProtocol: wire.AgentProtocolACP, PermissionPolicy: policy}, &c)
	f.send(c.ID, "hello")
	cl := f.claim()
	f.permissionEvent(cl, 1, wire.EventPermissionRequested, fmt.Sprintf(`{"request_id":%q,"policy":%q,"tool_call":{"toolCallId":"call_1","title":"write"},`+
		`"options":[{"optionId":"allow","name":"Allow","kind":"allow_once"},{"optionId":"reject","name":"Reject","kind":"reject_once"}]}`, id, policy))
	return cl
}

func (f *fixture) permissionEvent(cl wire.Claim, seq int64, typ, data string) {
	f.t.Helper()
	if _, err := f.wc.Events(context.Background(), cl.WorkerToken, cl.JobID, wire.EventsRequest{AttemptRef: ref(cl),
		Events: []wire.Event{{Seq: seq, Time: f.clock.Now(), Type: typ, Data: json.RawMessage(data)}}}); err != nil {
		f.t.Fatalf("upload %s: %v", typ, err)
	}
}

// A4: the owner's answer over the user API. A pending request is in the
// job's JSON and on its page with its options; an answer with one of them
// is recorded once and reaches the turn's long poll; a second answer, an
// answer to a request never asked, one answered by the supervisor, one
// under the allow policy and one of an ended job are 409 not_pending; an
// unknown option, an empty, missing or mistyped option_id and a body that
// is not JSON are 400 naming the field; an unknown job is 404. All in the
// documented error body.
func TestPermitAnswersAPendingRequest(t *testing.T) {
	onEachDatabase(t, func(t *testing.T, db database) {
		f := newFixtureOn(t, db)
		cl := permissionTurn(f, wire.PermissionAsk, "perm-1")
		path := "/v1/jobs/" + cl.JobID + "/permissions/perm-1"

		j := f.job(cl.JobID)
		if len(j.PendingPermissions) != 1 || j.PendingPermissions[0].RequestID != "perm-1" || len(j.PendingPermissions[0].Options) != 2 ||
			j.PendingPermissions[0].Options[1].OptionID != "reject" || j.PendingPermissions[0].AttemptID != cl.AttemptID {
			t.Fatalf("pending_permissions = %+v", j.PendingPermissions)
		}
		if code, b := f.do(http.MethodGet, "/admin/jobs/"+cl.JobID, userToken, ""); code != http.StatusOK ||
			!strings.Contains(string(b), `data-request="perm-1"`) || !strings.Contains(string(b), `data-option="reject"`) ||
			!strings.Contains(string(b), "controlplane permit "+cl.JobID+" perm-1 OPTION") {
			t.Fatalf("job page (%d) does not show the pending request with its options:\n%s", code, b)
		}

		for _, tc := range []struct{ body, code, field string }{
			{`{"option_id":"maybe"}`, wire.CodeInvalid, "option_id"},
			{`{"option_id":""}`, wire.CodeInvalid, "option_id"},
			{`{}`, wire.CodeInvalid, "option_id"},
			{`{"option_id":7}`, wire.CodeInvalid, "option_id"},
			{`{"option":"allow"}`, wire.CodeUnknownField, ""},
			{`not json`, wire.CodeBadJSON, ""},
		} {
			b := f.expect(http.MethodPost, path, userToken, tc.body, http.StatusBadRequest, tc.code)
			var eb wire.ErrorBody
			if err := json.Unmarshal(b, &eb); err != nil || eb.Message == "" || !strings.Contains(eb.Message, tc.field) {
				t.Errorf("%s: answer %s is not the error body naming %q", tc.body, b, tc.field)
			}
		}
		if got := f.job(cl.JobID).PendingPermissions; len(got) != 1 {
			t.Fatalf("a refused answer changed the pending requests: %+v", got)
		}
		f.expect(http.MethodPost, "/v1/jobs/no-such-job/permissions/perm-1", userToken, `{"option_id":"allow"}`, http.StatusNotFound, wire.CodeNotFound)
		f.expect(http.MethodPost, "/v1/jobs/"+cl.JobID+"/permissions/perm-9", userToken, `{"option_id":"allow"}`, http.StatusConflict, wire.CodeNotPending)
		f.expect(http.MethodPost, path, "", `{"option_id":"allow"}`, http.StatusUnauthorized, wire.CodeUnauthorized)

		// Nothing yet: the turn's poll answers 204 (an empty option).
		poll := wire.PermissionsRequest{AttemptRef: ref(cl), RequestID: "perm-1"}
		if opt, err := f.wc.PermissionAnswer(context.Background(), cl.WorkerToken, cl.JobID, poll); err != nil || opt != "" {
			t.Fatalf("poll before the answer = %q, %v", opt, err)
		}
		var answered wire.Job
		f.user(http.MethodPost, path, wire.PermissionAnswer{OptionID: "reject"}, &answered)
		if answered.ID != cl.JobID || len(answered.PendingPermissions) != 0 || !hasEvent(answered, wire.EventPermissionAnswer) {
			t.Fatalf("answer = %+v; want the job without the request, with a permission_answer event", answered)
		}
		poll.WaitMS = 5000
		if opt, err := f.wc.PermissionAnswer(context.Background(), cl.WorkerToken, cl.JobID, poll); err != nil || opt != "reject" {
			t.Fatalf("poll after the answer = %q, %v; want reject", opt, err)
		}
		f.expect(http.MethodPost, path, userToken, `{"option_id":"allow"}`, http.StatusConflict, wire.CodeNotPending)
		f.expect(http.MethodPost, path, userToken, `{"option_id":"reject"}`, http.StatusConflict, wire.CodeNotPending)

		// Answered by the supervisor (a timeout): not pending.
		f.permissionEvent(cl, 2, wire.EventPermissionRequested, `{"request_id":"perm-2","policy":"ask","options":[{"optionId":"allow","name":"Allow","kind":"allow_once"}]}`)
		f.permissionEvent(cl, 3, wire.EventPermissionAnswered, `{"request_id":"perm-2","outcome":"cancelled","by":"timeout"}`)
		f.expect(http.MethodPost, "/v1/jobs/"+cl.JobID+"/permissions/perm-2", userToken, `{"option_id":"allow"}`, http.StatusConflict, wire.CodeNotPending)

		// The turn ended with a request still waiting: not pending.
		f.permissionEvent(cl, 4, wire.EventPermissionRequested, `{"request_id":"perm-3","policy":"ask","options":[{"optionId":"allow","name":"Allow","kind":"allow_once"}]}`)
		if len(f.job(cl.JobID).PendingPermissions) != 1 {
			t.Fatalf("perm-3 is not pending")
		}
		if _, err := f.wc.Finish(context.Background(), cl.WorkerToken, cl.JobID, wire.FinishRequest{AttemptRef: ref(cl), Outcome: wire.OutcomeFailed, Class: "test"}); err != nil {
			t.Fatal(err)
		}
		if got := f.job(cl.JobID).PendingPermissions; len(got) != 0 {
			t.Fatalf("an ended job has pending requests: %+v", got)
		}
		f.expect(http.MethodPost, "/v1/jobs/"+cl.JobID+"/permissions/perm-3", userToken, `{"option_id":"allow"}`, http.StatusConflict, wire.CodeNotPending)

		// Under allow the policy answered at once: never pending.
		al := permissionTurn(f, wire.PermissionAllow, "perm-1")
		if got := f.job(al.JobID).PendingPermissions; len(got) != 0 {
			t.Fatalf("allow: pending %+v", got)
		}
		f.expect(http.MethodPost, "/v1/jobs/"+al.JobID+"/permissions/perm-1", userToken, `{"option_id":"allow"}`, http.StatusConflict, wire.CodeNotPending)
	})
}

// The turn's poll for an answer is attempt-scoped: another job's worker
// token is refused, and so is a body without request_id.
func TestPermissionPollBadInput(t *testing.T) {
	f := newFixture(t)
	a := permissionTurn(f, wire.PermissionAsk, "perm-1")
	b := permissionTurn(f, wire.PermissionAsk, "perm-1")
	path := wire.AttemptPath(a.JobID, wire.OpPermissions)
	body := func(r wire.PermissionsRequest) string { s, _ := json.Marshal(r); return string(s) }
	f.expect(http.MethodPost, path, b.WorkerToken, body(wire.PermissionsRequest{AttemptRef: ref(a), RequestID: "perm-1"}), http.StatusForbidden, wire.CodeForbidden)
	f.expect(http.MethodPost, path, a.WorkerToken, body(wire.PermissionsRequest{AttemptRef: ref(a)}), http.StatusBadRequest, wire.CodeInvalid)
	f.expect(http.MethodPost, path, a.WorkerToken, body(wire.PermissionsRequest{AttemptRef: ref(a), RequestID: "perm-1", WaitMS: -1}), http.StatusBadRequest, wire.CodeInvalid)
	f.expect(http.MethodPost, path, userToken, body(wire.PermissionsRequest{AttemptRef: ref(a), RequestID: "perm-1"}), http.StatusUnauthorized, wire.CodeUnauthorized)
}

// The job page answers a pending request with one form per option: only
// its own form (same origin, its CSRF token) answers; an option the
// request did not offer and an answer to a request no longer pending are
// refused in words with their status; the page's answer reaches the
// turn's poll.
func TestPermitFormOnTheJobPage(t *testing.T) {
	f := newFixture(t)
	cl := permissionTurn(f, wire.PermissionAsk, "perm-1")
	jobPath := "/admin/jobs/" + cl.JobID
	status, page, _ := f.admin(adminRequest{method: "GET", path: jobPath})
	if status != http.StatusOK || !strings.Contains(page, `action="`+jobPath+`/permissions/perm-1"`) {
		t.Fatalf("GET %s: %d, no answer form:\n%s", jobPath, status, page)
	}
	token := csrfOf(t, page)
	form := jobPath + "/permissions/perm-1"
	sameOrigin := map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": f.url}
	if status, body, _ := f.admin(adminRequest{method: "POST", path: form, form: url.Values{"csrf": {token}, "option_id": {"allow"}},
		header: map[string]string{"Sec-Fetch-Site": "cross-site"}}); status != http.StatusForbidden {
		t.Fatalf("a cross-site answer: HTTP %d: %s", status, body)
	}
	if status, body, _ := f.admin(adminRequest{method: "POST", path: form, form: url.Values{"csrf": {token}, "option_id": {"maybe"}}, header: sameOrigin}); status != http.StatusBadRequest ||
		!strings.Contains(body, "not one of the request") {
		t.Fatalf("an unknown option from the page: HTTP %d: %s", status, body)
	}
	if got := f.job(cl.JobID).PendingPermissions; len(got) != 1 {
		t.Fatalf("a refused answer changed the pending requests: %+v", got)
	}
	status, _, h := f.admin(adminRequest{method: "POST", path: form, form: url.Values{"csrf": {token}, "option_id": {"reject"}}, header: sameOrigin})
	if status != http.StatusSeeOther || h.Get("Location") != jobPath {
		t.Fatalf("the page's own answer: HTTP %d to %q", status, h.Get("Location"))
	}
	if opt, err := f.wc.PermissionAnswer(context.Background(), cl.WorkerToken, cl.JobID, wire.PermissionsRequest{AttemptRef: ref(cl), RequestID: "perm-1"}); err != nil || opt != "reject" {
		t.Fatalf("the turn's poll after the page's answer: %q, %v", opt, err)
	}
	if status, body, _ := f.admin(adminRequest{method: "POST", path: form, form: url.Values{"csrf": {token}, "option_id": {"allow"}}, header: sameOrigin}); status != http.StatusConflict ||
		!strings.Contains(body, "not waiting for an answer") {
		t.Fatalf("a second answer from the page: HTTP %d: %s", status, body)
	}
}
