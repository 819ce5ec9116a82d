package controlplane_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/wire"
)

// A conversation's turns go only to the host that holds its retained
// sandbox, and GET /v1/conversations/{id} names that host.
func TestConversationShowsSandboxHostAndTurnsGoThere(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	tokenB := f.addHost("host-b")
	c := f.turn() // claimed by host-a
	if err := f.wc.Container(ctx, c.WorkerToken, c.JobID, wire.ContainerRequest{AttemptRef: ref(c), Backend: "docker", ContainerID: "ctr-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.wc.Abandon(ctx, c.WorkerToken, c.JobID, wire.AbandonRequest{AttemptRef: ref(c), Class: "image_missing"}); err != nil {
		t.Fatal(err)
	}
	conv := c.Turn.ConversationID
	_, body := f.do(http.MethodGet, "/v1/conversations/"+conv, userToken, "")
	if !strings.Contains(string(body), `"sandbox_host":"host-a"`) {
		t.Fatalf("GET conversation does not name the sandbox host: %s", body)
	}
	next := f.send(conv, "again")
	if _, err := f.wc.Claim(ctx, tokenB, wire.ClaimRequest{}); !errors.Is(err, wire.ErrNoClaim) {
		t.Fatalf("host-b claim of a turn whose sandbox is on host-a: %v, want no claim", err)
	}
	if got := f.claim(); got.JobID != next.ID {
		t.Fatalf("host-a claimed %s, want %s", got.JobID, next.ID)
	}
}

// When the host holding a sandbox is gone for good, the admin call marks
// the conversation LOST and fails its waiting turn in plain words; it is
// refused while a turn runs and needs the user token.
func TestAdminLosesConversationOfGoneHost(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	c := f.turn()
	conv := c.Turn.ConversationID
	path := "/v1/admin/conversations/" + conv + "/lose"
	if err := f.wc.Container(ctx, c.WorkerToken, c.JobID, wire.ContainerRequest{AttemptRef: ref(c), Backend: "docker", ContainerID: "ctr-1"}); err != nil {
		t.Fatal(err)
	}
	f.expect(http.MethodPost, path, userToken, `{"reason":"host-a is gone"}`, http.StatusBadRequest, wire.CodeInvalid)
	f.expect(http.MethodPost, path, f.hostToken, `{"reason":"host-a is gone"}`, http.StatusUnauthorized, wire.CodeUnauthorized)
	if _, err := f.wc.Abandon(ctx, c.WorkerToken, c.JobID, wire.AbandonRequest{AttemptRef: ref(c), Class: "image_missing"}); err != nil {
		t.Fatal(err)
	}
	waiting := f.send(conv, "again") // for host-a, which never comes back

	// Without a reason: refused by name, nothing marked.
	for _, body := range []string{"", `{}`, `{"reason":"  "}`} {
		if b := f.expect(http.MethodPost, path, userToken, body, http.StatusBadRequest, wire.CodeInvalid); !strings.Contains(string(b), "reason is required") {
			t.Fatalf("mark-lost with body %q: %s, want the reason named", body, b)
		}
	}
	var before wire.Conversation
	f.user(http.MethodGet, "/v1/conversations/"+conv, nil, &before)
	if before.State == wire.ConversationLost {
		t.Fatalf("a mark-lost without a reason marked it: %+v", before)
	}
	var cv wire.Conversation
	f.user(http.MethodPost, path, wire.LoseRequest{Reason: "host-a's disk died"}, &cv)
	if cv.State != wire.ConversationLost || cv.LostReason == "" || cv.SandboxHost != "host-a" {
		t.Fatalf("after the admin call: %+v", cv)
	}
	if j := f.job(waiting.ID); j.State != wire.JobFailed || j.Reason == "" {
		t.Fatalf("the waiting turn: state %s, reason %q", j.State, j.Reason)
	}
	f.expect(http.MethodPost, "/v1/conversations/"+conv+"/messages", userToken, `{"prompt":"hi"}`, http.StatusConflict, wire.CodeConversationLost)
	f.expect(http.MethodPost, "/v1/admin/conversations/conv_nope/lose", userToken, `{"reason":"x"}`, http.StatusNotFound, wire.CodeNotFound)
	var audit wire.AuditList
	f.user(http.MethodGet, controlplane.PathAdminAudit+"?action="+wire.AuditConversationLose, nil, &audit)
	if len(audit.Entries) != 1 || audit.Entries[0].Actor != "test" || audit.Entries[0].Target != conv || audit.Entries[0].Reason != "host-a's disk died" {
		t.Fatalf("the mark-lost's audit = %+v, want one row: actor test, target %s, the reason", audit, conv)
	}
	if !strings.Contains(f.logs.String(), `"msg":"controlplane_conversation_lost_by_operator"`) {
		t.Fatal("no controlplane_conversation_lost_by_operator record")
	}
}
