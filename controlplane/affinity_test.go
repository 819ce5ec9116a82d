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
