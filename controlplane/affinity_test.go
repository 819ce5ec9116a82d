package controlplane_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

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
	f.expect(http.MethodPost, path, userToken, "", http.StatusBadRequest, wire.CodeInvalid)
	f.expect(http.MethodPost, path, f.hostToken, "", http.StatusUnauthorized, wire.CodeUnauthorized)
	if _, err := f.wc.Abandon(ctx, c.WorkerToken, c.JobID, wire.AbandonRequest{AttemptRef: ref(c), Class: "image_missing"}); err != nil {
		t.Fatal(err)
	}
	waiting := f.send(conv, "again") // for host-a, which never comes back

	var cv wire.Conversation
	f.user(http.MethodPost, path, nil, &cv)
	if cv.State != wire.ConversationLost || cv.LostReason == "" || cv.SandboxHost != "host-a" {
		t.Fatalf("after the admin call: %+v", cv)
	}
	if j := f.job(waiting.ID); j.State != wire.JobFailed || j.Reason == "" {
		t.Fatalf("the waiting turn: state %s, reason %q", j.State, j.Reason)
	}
	f.expect(http.MethodPost, "/v1/conversations/"+conv+"/messages", userToken, `{"prompt":"hi"}`, http.StatusConflict, wire.CodeConversationLost)
	f.expect(http.MethodPost, "/v1/admin/conversations/conv_nope/lose", userToken, "", http.StatusNotFound, wire.CodeNotFound)
	if !strings.Contains(f.logs.String(), `"msg":"controlplane_conversation_lost_by_operator"`) {
		t.Fatal("no controlplane_conversation_lost_by_operator record")
	}
}
