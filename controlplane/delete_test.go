package controlplane_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/wire"
)

// The documented answers of DELETE /v1/conversations/{id} and of a message
// to a deleted conversation (docs/protocol.md), byte for byte.
const (
	busyBody    = `{"code":"conversation_busy","message":"A turn of this conversation is running or waiting; cancel it first, then delete the conversation."}`
	deletedBody = `{"code":"gone","message":"This conversation was deleted; it takes no new messages. Start a new conversation to continue."}`
)

// S3 over HTTP, on SQLite and PostgreSQL: the owner deletes a conversation
// only while no turn of it waits or runs (409 conversation_busy, cancel
// first); then it is deleted, a message to it is 410 gone, its host's
// question answers deleted with the sandbox recorded there (the sweep's
// positive answer, K8), a second delete answers the same, an unknown id is
// 404, and the delete is recorded.
func TestS3DeleteConversation(t *testing.T) {
	onEachDatabase(t, func(t *testing.T, db database) {
		f := newFixtureOn(t, db)
		ctx := context.Background()
		conv := f.newConversation().ID
		path := "/v1/conversations/" + conv

		// A waiting turn refuses, and so does a running one.
		queued := f.send(conv, "one")
		if st, b := f.do(http.MethodDelete, path, userToken, ""); st != http.StatusConflict || string(b) != busyBody+"\n" {
			t.Fatalf("delete with a waiting turn: %d %s, want 409 %s", st, b, busyBody)
		}
		c := f.claim()
		if c.JobID != queued.ID {
			t.Fatalf("claimed %s, want %s", c.JobID, queued.ID)
		}
		if err := f.wc.Container(ctx, c.WorkerToken, c.JobID, wire.ContainerRequest{AttemptRef: ref(c), Backend: "process", ContainerID: "ws-1"}); err != nil {
			t.Fatal(err)
		}
		if st, b := f.do(http.MethodDelete, path, userToken, ""); st != http.StatusConflict || string(b) != busyBody+"\n" {
			t.Fatalf("delete with a running turn: %d %s, want 409 %s", st, b, busyBody)
		}
		// Cancel first: before admission the turn ends cancelled.
		f.user(http.MethodPost, "/v1/jobs/"+c.JobID+"/cancel", nil, nil)
		if _, err := f.wc.Finish(ctx, c.WorkerToken, c.JobID, wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeCancelled}); err != nil {
			t.Fatal(err)
		}

		var deleted wire.Conversation
		f.user(http.MethodDelete, path, nil, &deleted)
		if deleted.ID != conv || deleted.State != wire.ConversationDeleted {
			t.Fatalf("DELETE answered %+v, want the conversation deleted", deleted)
		}
		var again wire.Conversation
		f.user(http.MethodDelete, path, nil, &again)
		if again.State != wire.ConversationDeleted {
			t.Fatalf("second DELETE answered %+v", again)
		}
		var got wire.Conversation
		f.user(http.MethodGet, path, nil, &got)
		if got.State != wire.ConversationDeleted {
			t.Fatalf("GET after delete: %+v", got)
		}
		if st, b := f.do(http.MethodPost, path+"/messages", userToken, `{"prompt":"still there?"}`); st != http.StatusGone || string(b) != deletedBody+"\n" {
			t.Fatalf("message to a deleted conversation: %d %s, want 410 %s", st, b, deletedBody)
		}
		states, err := f.wc.ConversationStates(ctx, f.hostToken, wire.ConversationStatesRequest{ConversationIDs: []string{conv}})
		want := []wire.ConversationState{{ID: conv, State: wire.ConversationDeleted, Sandbox: wire.SandboxThisHost, SandboxHost: "host-a"}}
		if err != nil || !slices.Equal(states.Conversations, want) {
			t.Fatalf("conversation states: %+v, %v; want %+v", states.Conversations, err, want)
		}
		// Admin → Conversations shows it deleted, with no "mark lost" form.
		if st, page := f.do(http.MethodGet, "/admin/conversations", userToken, ""); st != http.StatusOK ||
			!strings.Contains(string(page), `<span class="deleted">Deleted</span>`) || strings.Contains(string(page), "/admin/conversations/"+conv+"/lose") {
			t.Fatalf("admin conversations page (%d) does not show %s deleted, or offers to mark it lost:\n%s", st, conv, page)
		}
		f.expect(http.MethodDelete, "/v1/conversations/conv_nobody-has-this-one", userToken, "", http.StatusNotFound, wire.CodeNotFound)
		f.expect(http.MethodDelete, path, f.hostToken, "", http.StatusUnauthorized, wire.CodeUnauthorized)

		var recorded int
		for _, line := range strings.Split(f.logs.String(), "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == controlplane.MsgConversationDeleted && rec["conversation_id"] == conv {
				recorded++
			}
		}
		if recorded != 2 {
			t.Fatalf("%d %s records for %s, want one per answered delete (2):\n%s", recorded, controlplane.MsgConversationDeleted, conv, f.logs.String())
		}
	})
}
