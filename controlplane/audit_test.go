package controlplane_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// The admin audit over the API: each host action is
// recorded with the acting token's name (never a token), the time, the
// host and the reason; remove without a reason is 400 invalid naming the
// field and records nothing; GET /v1/admin/audit filters by target,
// action and since, pages with a stable cursor, refuses bad input by
// name, and needs a user token.
func TestAuditRecordsAdminActionsWithActorAndReason(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	const opToken = "rdu_audit-operator-token-0123456789"
	if _, err := f.st.CreateUserToken(ctx, "alice", controlplane.HashToken(opToken), store.Audit{Actor: "test"}, f.clock.Now()); err != nil {
		t.Fatalf("create token: %v", err)
	}
	f.addHost("host-b")
	hostPath := func(name, action string) string {
		return strings.ReplaceAll(controlplane.PathAdminHost, "{name}", name) + action
	}
	f.clock.Advance(time.Second) // the fixture's own rows (its hosts, tokens) are older than t0
	t0 := f.clock.Now()
	since := "since=" + t0.Format(time.RFC3339Nano)
	f.expect(http.MethodPost, hostPath("host-a", "pause"), opToken, `{"reason":"kernel upgrade"}`, http.StatusOK, "")
	f.clock.Advance(time.Second)
	f.expect(http.MethodPost, hostPath("host-a", "resume"), userToken, "", http.StatusOK, "")
	f.clock.Advance(time.Second)
	f.expect(http.MethodPost, hostPath("host-b", "rotate-token"), opToken, `{"grace_ms":0,"reason":"leaked"}`, http.StatusOK, "")
	f.clock.Advance(time.Second)

	// Refused: no reason for remove; an unknown field; an unknown host.
	b := f.expect(http.MethodPost, hostPath("host-b", "remove"), opToken, `{}`, http.StatusBadRequest, wire.CodeInvalid)
	if !strings.Contains(string(b), "reason") {
		t.Fatalf("the refusal does not name the field: %s", b)
	}
	f.expect(http.MethodPost, hostPath("host-b", "remove"), opToken, `{"reason":"   "}`, http.StatusBadRequest, wire.CodeInvalid)
	f.expect(http.MethodPost, hostPath("host-b", "remove"), opToken, `{"why":"x"}`, http.StatusBadRequest, wire.CodeUnknownField)
	f.expect(http.MethodPost, hostPath("nobody", "pause"), opToken, `{"reason":"x"}`, http.StatusNotFound, wire.CodeNotFound)
	f.expect(http.MethodPost, hostPath("host-b", "remove"), opToken, `{"reason":"decommissioned"}`, http.StatusNoContent, "")

	list := func(query string) wire.AuditList {
		t.Helper()
		var l wire.AuditList
		f.user(http.MethodGet, controlplane.PathAdminAudit+"?"+since+query, nil, &l)
		return l
	}
	all := list("")
	type row struct{ actor, action, target, reason string }
	want := []row{
		{"alice", wire.AuditHostRemove, "host-b", "decommissioned"},
		{"alice", wire.AuditHostRotateToken, "host-b", "leaked"},
		{"test", wire.AuditHostResume, "host-a", ""},
		{"alice", wire.AuditHostPause, "host-a", "kernel upgrade"},
	}
	if len(all.Entries) != len(want) || all.NextCursor != "" {
		t.Fatalf("audit = %+v, want %d rows and no next page", all, len(want))
	}
	for i, e := range all.Entries {
		if got := (row{e.Actor, e.Action, e.Target, e.Reason}); got != want[i] {
			t.Errorf("audit[%d] = %+v, want %+v", i, got, want[i])
		}
	}
	if at := all.Entries[3].At; !at.Equal(t0) {
		t.Errorf("the pause is recorded at %s, want %s", at, t0)
	}
	raw := f.expect(http.MethodGet, controlplane.PathAdminAudit, userToken, "", http.StatusOK, "")
	for _, secret := range []string{opToken, userToken, "rdu_"} {
		if strings.Contains(string(raw), secret) {
			t.Fatalf("a token is in the audit: %s", raw)
		}
	}

	if l := list("&target=host-a"); len(l.Entries) != 2 || l.Entries[0].Action != wire.AuditHostResume {
		t.Errorf("target=host-a = %+v", l)
	}
	if l := list("&action=" + wire.AuditHostPause); len(l.Entries) != 1 || l.Entries[0].Reason != "kernel upgrade" {
		t.Errorf("action=host.pause = %+v", l)
	}
	var later wire.AuditList
	f.user(http.MethodGet, controlplane.PathAdminAudit+"?since="+t0.Add(2*time.Second).Format(time.RFC3339Nano), nil, &later)
	if len(later.Entries) != 2 {
		t.Errorf("since = %+v, want the rotation and the removal", later)
	}

	// Pages of 3, then 1; a row written meanwhile does not shift page 2.
	p1 := list("&limit=3")
	if len(p1.Entries) != 3 || p1.NextCursor == "" {
		t.Fatalf("page 1 = %+v", p1)
	}
	b = f.expect(http.MethodPost, hostPath("host-a", "pause"), opToken, `{"reason":"disk <full>"}`, http.StatusOK, "")
	var sv wire.Server
	if err := json.Unmarshal(b, &sv); err != nil || sv.PausedBy != "alice" || sv.PauseReason != "disk <full>" {
		t.Fatalf("the pause's answer = %s, %v; want who and why", b, err)
	}
	page := string(f.expect(http.MethodGet, "/admin/servers", userToken, "", http.StatusOK, ""))
	if !strings.Contains(page, `<span class="paused-by">by alice</span>`) || !strings.Contains(page, `<span class="pause-reason">disk &lt;full&gt;</span>`) {
		t.Fatalf("Admin → Servers does not show who paused host-a and why:\n%s", page)
	}
	p2 := list("&limit=3&cursor=" + p1.NextCursor)
	if len(p2.Entries) != 1 || p2.Entries[0].ID != all.Entries[3].ID || p2.NextCursor != "" {
		t.Fatalf("page 2 = %+v, want the first pause alone", p2)
	}

	for _, q := range []string{"?state=x", "?action=host.explode", "?since=yesterday", "?limit=-1", "?limit=501", "?cursor=jc5", "?cursor=ac0", "?target=a%20b"} {
		b := f.expect(http.MethodGet, controlplane.PathAdminAudit+q, userToken, "", http.StatusBadRequest, wire.CodeInvalid)
		var eb wire.ErrorBody
		if err := json.Unmarshal(b, &eb); err != nil || eb.Message == "" {
			t.Errorf("%s: body %s", q, b)
		}
	}
	f.expect(http.MethodGet, controlplane.PathAdminAudit, "", "", http.StatusUnauthorized, wire.CodeUnauthorized)
	f.expect(http.MethodGet, controlplane.PathAdminAudit, f.hostToken, "", http.StatusUnauthorized, wire.CodeUnauthorized)
}
