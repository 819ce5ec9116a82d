package controlplane_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/runnerd/runnerd/wire"
)

// A1: a conversation names its agent's protocol and, for ACP, its
// permission policy; both reach the claimed turn. Unknown values are 400
// invalid naming the field; lines is the default and takes no policy.
func TestAgentProtocolReachesTheTurn(t *testing.T) {
	onEachDatabase(t, func(t *testing.T, db database) {
		f := newFixtureOn(t, db)
		for _, tc := range []struct {
			body, field string
		}{
			{`{"image":"i","agent_command":["a"],"agent_protocol":"grpc"}`, "agent_protocol"},
			{`{"image":"i","agent_command":["a"],"agent_protocol":"acp","permission_policy":"maybe"}`, "permission_policy"},
			{`{"image":"i","agent_command":["a"],"permission_policy":"allow"}`, "permission_policy"},
		} {
			b := f.expect(http.MethodPost, "/v1/conversations", userToken, tc.body, http.StatusBadRequest, wire.CodeInvalid)
			if !strings.Contains(string(b), tc.field) {
				t.Errorf("%s: answer %s does not name %s", tc.body, b, tc.field)
			}
		}
		for _, tc := range []struct {
			req                  wire.CreateConversationRequest
			protocol, permission string
		}{
			{wire.CreateConversationRequest{}, wire.AgentProtocolLines, ""},
			{wire.CreateConversationRequest{AgentProtocol: wire.AgentProtocolACP}, wire.AgentProtocolACP, wire.PermissionAsk},
			{wire.CreateConversationRequest{AgentProtocol: wire.AgentProtocolACP, PermissionPolicy: wire.PermissionReject}, wire.AgentProtocolACP, wire.PermissionReject},
		} {
			req := tc.req
			req.Image, req.AgentCommand = "i", []string{"agent"}
			var c wire.Conversation
			f.user(http.MethodPost, "/v1/conversations", req, &c)
			var got wire.Conversation
			f.user(http.MethodGet, "/v1/conversations/"+c.ID, nil, &got)
			if c.AgentProtocol != tc.protocol || got.AgentProtocol != tc.protocol || got.PermissionPolicy != tc.permission {
				t.Fatalf("%+v: created %q, read %q/%q; want %q/%q", tc.req, c.AgentProtocol, got.AgentProtocol, got.PermissionPolicy, tc.protocol, tc.permission)
			}
			f.send(c.ID, "hello")
			cl := f.claim()
			if cl.Turn.ConversationID != c.ID || cl.Turn.AgentProtocol != tc.protocol || cl.Turn.PermissionPolicy != tc.permission {
				t.Fatalf("claimed turn %+v; want %s with %q/%q", cl.Turn, c.ID, tc.protocol, tc.permission)
			}
		}
	})
}
