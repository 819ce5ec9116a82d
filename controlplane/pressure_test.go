package controlplane_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/wire"
)

// S2: a host's sandbox_pressure is shown on Admin → Servers, beside its
// launch error, and in the host JSON (GET /v1/admin/servers); a malformed
// one is refused; the next heartbeat without it clears it.
func TestS2SandboxPressureOnServers(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	since := f.clock.Now().Add(-time.Minute)
	p := wire.SandboxPressure{Resource: wire.PressureDisk, FreeBytes: 4 << 20, TotalBytes: 32 << 20, MinFreeBytes: 8 << 20, Since: since}
	if _, err := f.wc.HostHeartbeat(ctx, f.hostToken, wire.HostHeartbeat{Capacity: 2, SandboxPressure: &p}); err != nil {
		t.Fatal(err)
	}
	var list wire.ServerList
	f.user(http.MethodGet, "/v1/admin/servers", nil, &list)
	if len(list.Servers) != 1 || list.Servers[0].SandboxPressure == nil || *list.Servers[0].SandboxPressure != p {
		t.Fatalf("host JSON %+v, want sandbox_pressure %+v", list.Servers, p)
	}
	status, body, _ := f.admin(adminRequest{method: "GET", path: "/admin/servers"})
	if status != http.StatusOK || !strings.Contains(body, "sandbox_pressure: disk 4194304 of 33554432 bytes free (at least 8388608 wanted)") ||
		!strings.Contains(body, "first turns withheld") {
		t.Fatalf("Admin → Servers (%d) does not show the pressure:\n%s", status, body)
	}
	bad := p
	bad.Resource = "cpu"
	if _, err := f.wc.HostHeartbeat(ctx, f.hostToken, wire.HostHeartbeat{Capacity: 2, SandboxPressure: &bad}); diagnostics.Status(err) != http.StatusBadRequest {
		t.Fatalf("a heartbeat with sandbox_pressure resource cpu: %v, want 400", err)
	}
	if _, err := f.wc.HostHeartbeat(ctx, f.hostToken, wire.HostHeartbeat{Capacity: 2}); err != nil {
		t.Fatal(err)
	}
	list = wire.ServerList{}
	f.user(http.MethodGet, "/v1/admin/servers", nil, &list)
	if list.Servers[0].SandboxPressure != nil {
		t.Fatalf("after a heartbeat without it: sandbox_pressure %+v, want none", *list.Servers[0].SandboxPressure)
	}
}

// S1: the host holding a conversation's sandbox says with its sweep that
// it is stopped; the conversation JSON and Admin → Conversations show it,
// and only for a conversation the host was asking about.
func TestS1StoppedSandboxShown(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	conv := f.newConversation()
	f.send(conv.ID, "hello")
	c := f.claim()
	if err := f.wc.Container(ctx, c.WorkerToken, c.JobID, wire.ContainerRequest{AttemptRef: ref(c), Backend: "process", ContainerID: "proc-1"}); err != nil {
		t.Fatal(err)
	}
	var cv wire.Conversation
	f.user(http.MethodGet, "/v1/conversations/"+conv.ID, nil, &cv)
	if cv.SandboxState != wire.SandboxRunning {
		t.Fatalf("after its sandbox was recorded: sandbox_state %q, want running", cv.SandboxState)
	}
	ask := wire.ConversationStatesRequest{ConversationIDs: []string{conv.ID},
		SandboxStates: map[string]string{conv.ID: wire.SandboxStopped}}
	if _, err := f.wc.ConversationStates(ctx, f.hostToken, ask); err != nil {
		t.Fatal(err)
	}
	f.user(http.MethodGet, "/v1/conversations/"+conv.ID, nil, &cv)
	if cv.SandboxState != wire.SandboxStopped {
		t.Fatalf("after its host said stopped: sandbox_state %q", cv.SandboxState)
	}
	status, body, _ := f.admin(adminRequest{method: "GET", path: "/admin/conversations"})
	if status != http.StatusOK || !strings.Contains(body, `<span class="sandbox-stopped">(stopped)</span>`) {
		t.Fatalf("Admin → Conversations (%d) does not show the stopped sandbox:\n%s", status, body)
	}
	unasked := wire.ConversationStatesRequest{ConversationIDs: []string{"conv_other"},
		SandboxStates: map[string]string{conv.ID: wire.SandboxRunning}}
	if _, err := f.wc.ConversationStates(ctx, f.hostToken, unasked); diagnostics.Status(err) != http.StatusBadRequest {
		t.Fatalf("a state for a conversation not asked about: %v, want 400", err)
	}
}
