package controlplane_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/internal/syncbuf"
	"github.com/runnerd/runnerd/wire"
)

// lostConversation runs one turn into a LOST conversation: admitted, then
// failed with its retained session gone (R31).
func (f *fixture) lostConversation() string {
	f.t.Helper()
	c := f.turn()
	ctx := context.Background()
	if _, err := f.wc.Admission(ctx, c.WorkerToken, c.JobID, wire.AdmissionRequest{AttemptRef: ref(c), ActivationID: "act-1"}); err != nil {
		f.t.Fatal(err)
	}
	resp, err := f.wc.Finish(ctx, c.WorkerToken, c.JobID, wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeFailed, Class: "workspace_missing", Unrecoverable: true})
	if err != nil || resp.ConversationState != wire.ConversationLost {
		f.t.Fatalf("finish: %+v, %v; want the conversation lost", resp, err)
	}
	return c.Turn.ConversationID
}

// Issue 6/7: a host learns which of its sandboxes' conversations are
// usable, lost or unknown (never created, or deleted), one entry per
// distinct id in the order asked, with its host token.
func TestConversationStates(t *testing.T) {
	f := newFixture(t)
	usable := f.newConversation().ID
	lost := f.lostConversation()
	const unknown = "conv_nobody-has-this-one"

	got, err := f.wc.ConversationStates(context.Background(), f.hostToken, wire.ConversationStatesRequest{
		ConversationIDs: []string{lost, usable, unknown, lost},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []wire.ConversationState{
		{ID: lost, State: wire.ConversationLost},
		{ID: usable, State: wire.ConversationUsable},
		{ID: unknown, State: wire.ConversationUnknown},
	}
	if !slices.Equal(got.Conversations, want) {
		t.Fatalf("states %+v, want %+v", got.Conversations, want)
	}

	// Another host's token answers the same: the state is the
	// conversation's, not the host's.
	other := f.addHost("host-b")
	if got2, err := f.wc.ConversationStates(context.Background(), other, wire.ConversationStatesRequest{ConversationIDs: []string{lost}}); err != nil ||
		!slices.Equal(got2.Conversations, want[:1]) {
		t.Fatalf("another host: %+v, %v", got2, err)
	}

	// A sandbox recorded on the asking host is "this_host"; on another,
	// "other_host", with that host's name. Nothing recorded: no field.
	c := f.turn()
	if err := f.wc.Container(context.Background(), c.WorkerToken, c.JobID, wire.ContainerRequest{AttemptRef: ref(c), Backend: "process", ContainerID: "ws-1"}); err != nil {
		t.Fatal(err)
	}
	conv := c.Turn.ConversationID
	for _, tc := range []struct {
		token string
		want  wire.ConversationState
	}{
		{f.hostToken, wire.ConversationState{ID: conv, State: wire.ConversationUsable, Sandbox: wire.SandboxThisHost, SandboxHost: "host-a"}},
		{other, wire.ConversationState{ID: conv, State: wire.ConversationUsable, Sandbox: wire.SandboxOtherHost, SandboxHost: "host-a"}},
	} {
		got, err := f.wc.ConversationStates(context.Background(), tc.token, wire.ConversationStatesRequest{ConversationIDs: []string{conv}})
		if err != nil || !slices.Equal(got.Conversations, []wire.ConversationState{tc.want}) {
			t.Fatalf("recorded sandbox: %+v, %v; want %+v", got.Conversations, err, tc.want)
		}
	}
	raw := f.expect(http.MethodPost, wire.PathConversations, other, `{"conversation_ids":["`+conv+`"]}`, http.StatusOK, "")
	if !strings.Contains(string(raw), `"sandbox":"other_host","sandbox_host":"host-a"`) {
		t.Fatalf("recorded sandbox answered %s", raw)
	}

	// No ids: an empty list, not null.
	raw = f.expect(http.MethodPost, wire.PathConversations, f.hostToken, `{"conversation_ids":[]}`, http.StatusOK, "")
	cluster, _ := f.st.ClusterID(context.Background())
	if strings.TrimSpace(string(raw)) != `{"conversations":[],"cluster_id":"`+cluster+`"}` {
		t.Fatalf("empty request answered %s", raw)
	}
}

// At most wire.MaxConversationIDs ids; more, or an empty id, is 400
// invalid. A full request of unknown ids answers every one.
func TestConversationStatesLimits(t *testing.T) {
	f := newFixture(t)
	ids := make([]string, wire.MaxConversationIDs+1)
	for i := range ids {
		ids[i] = fmt.Sprintf("conv_%04d", i)
	}
	got, err := f.wc.ConversationStates(context.Background(), f.hostToken, wire.ConversationStatesRequest{ConversationIDs: ids[:wire.MaxConversationIDs]})
	if err != nil || len(got.Conversations) != wire.MaxConversationIDs {
		t.Fatalf("%d ids: %d answers, %v", wire.MaxConversationIDs, len(got.Conversations), err)
	}
	for _, c := range got.Conversations {
		if c.State != wire.ConversationUnknown {
			t.Fatalf("%s is %s, want unknown", c.ID, c.State)
		}
	}
	for _, tc := range []struct {
		name string
		ids  []string
	}{
		{"one too many", ids},
		{"empty id", []string{"conv_a", ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.wc.ConversationStates(context.Background(), f.hostToken, wire.ConversationStatesRequest{ConversationIDs: tc.ids})
			if st, code := statusOf(err); st != http.StatusBadRequest || code != wire.CodeInvalid || wire.Classify(err) != wire.Permanent {
				t.Fatalf("%v, want 400 invalid (permanent)", err)
			}
		})
	}
}

// Only a host token asks: none, a worker token, the user token or a made-up
// one is 401, and the answer says nothing of the conversations.
func TestConversationStatesNeedsHostToken(t *testing.T) {
	f := newFixture(t)
	c := f.turn()
	body := mustJSON(t, wire.ConversationStatesRequest{ConversationIDs: []string{c.Turn.ConversationID}})
	for _, tc := range []struct{ name, token string }{
		{"none", ""},
		{"worker token", c.WorkerToken},
		{"user token", userToken},
		{"unknown host token", controlplane.NewToken(controlplane.HostTokenPrefix)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := f.expect(http.MethodPost, wire.PathConversations, tc.token, body, http.StatusUnauthorized, wire.CodeUnauthorized)
			if strings.Contains(string(raw), c.Turn.ConversationID) {
				t.Fatalf("a refusal names the conversation: %s", raw)
			}
		})
	}
	f.expect(http.MethodGet, wire.PathConversations, f.hostToken, "", http.StatusMethodNotAllowed, wire.CodeMethodNotAllowed)
}

// Bodies are decoded strictly, as for every worker call, and never echoed.
func TestConversationStatesRefusesBadBodies(t *testing.T) {
	f := newFixture(t)
	for _, b := range []struct{ name, body, code string }{
		{"malformed", `{"conversation_ids": [SECRET-1`, wire.CodeBadJSON},
		{"wrong type", `{"conversation_ids": "SECRET-2"}`, wire.CodeBadJSON},
		{"unknown field", `{"conversation_ids": [], "SECRET-3": 1}`, wire.CodeUnknownField},
		{"trailing data", `{"conversation_ids": []} {"x": "SECRET-4"}`, wire.CodeBadJSON},
		{"empty", ``, wire.CodeBadJSON},
		{"oversize", `{"conversation_ids": ["SECRET-5` + strings.Repeat("a", wire.MaxBodyBytes) + `"]}`, wire.CodeBodyTooLarge},
	} {
		t.Run(b.name, func(t *testing.T) {
			raw := f.expect(http.MethodPost, wire.PathConversations, f.hostToken, b.body, http.StatusBadRequest, b.code)
			if strings.Contains(string(raw), "SECRET") {
				t.Fatalf("answer echoes the body: %s", raw)
			}
		})
	}
}

// failingReads is the real store whose read of conversation states fails
// the way a lost database connection does.
type failingReads struct{ store.Store }

func (failingReads) ConversationStates(context.Context, []string) (map[string]store.ConversationState, error) {
	return nil, errors.New("connection reset")
}

// A conversation the store could not read is a 503 (transient), never
// "unknown": the host would delete the sandbox of a usable conversation.
func TestConversationStatesStoreFailureIsNotUnknown(t *testing.T) {
	f := newFixture(t)
	logs := &syncbuf.Buffer{}
	srv := controlplane.New(controlplane.Config{
		Store:  failingReads{f.st},
		Logger: slog.New(slog.NewJSONHandler(logs, nil)),
	})
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	wc := &wire.Client{BaseURL: hs.URL, HTTP: hs.Client()}
	got, err := wc.ConversationStates(context.Background(), f.hostToken, wire.ConversationStatesRequest{ConversationIDs: []string{f.newConversation().ID}})
	if st, code := statusOf(err); st != http.StatusServiceUnavailable || code != wire.CodeInternal || wire.Classify(err) != wire.Transient {
		t.Fatalf("%+v, %v; want 503 internal (transient)", got, err)
	}
	if !strings.Contains(logs.String(), `"op":"conversation_states"`) || strings.Contains(logs.String(), "connection reset") {
		t.Fatalf("want one failure record with the operation and no error text:\n%s", logs)
	}
}

// K8: the host calls that decide about sandboxes carry the database's
// cluster identity: the host heartbeat's answer (first contact), the
// conversation states' answer, and each claim (the host records it with
// a sandbox it creates for the turn: K8 per sandbox).
func TestK8HostCallsCarryClusterIdentity(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	want, err := f.st.ClusterID(ctx)
	if err != nil || want == "" {
		t.Fatalf("ClusterID = %q, %v", want, err)
	}
	hb, err := f.wc.HostHeartbeat(ctx, f.hostToken, wire.HostHeartbeat{Capacity: 1})
	if err != nil || hb.ClusterID != want {
		t.Fatalf("heartbeat answer %+v, %v; want cluster %q", hb, err, want)
	}
	st, err := f.wc.ConversationStates(ctx, f.hostToken, wire.ConversationStatesRequest{ConversationIDs: []string{"conv_x"}})
	if err != nil || st.ClusterID != want || len(st.Conversations) != 1 || st.Conversations[0].State != wire.ConversationUnknown {
		t.Fatalf("conversation states answer %+v, %v; want cluster %q", st, err, want)
	}
	f.send(f.newConversation().ID, "hello")
	if cl := f.claim(); cl.ClusterID != want {
		t.Fatalf("claim carries cluster %q, want %q", cl.ClusterID, want)
	}
}
