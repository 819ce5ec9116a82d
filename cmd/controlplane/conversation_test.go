package main

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/runnerd/runnerd/wire"
)

// `controlplane conversation delete ID` against a real serve (S3): a
// waiting turn refuses it with the way out (cancel first) and exit 1;
// after the cancel it deletes, a message is then refused 410, an unknown
// id exits 1, and a missing ID is a usage error.
func TestConversationDeleteCommand(t *testing.T) {
	dir := t.TempDir()
	s := startServe(t, "--data-dir", dir)
	env := envOf(t, map[string]string{"CONTROLPLANE_SERVER": s.addr, "CONTROLPLANE_DATA_DIR": dir})
	ctx := context.Background()
	wc := &wire.Client{BaseURL: s.addr}
	tok := readUserToken(t, dir)
	var conv wire.Conversation
	if _, err := wc.Do(ctx, http.MethodPost, "/v1/conversations", tok, wire.CreateConversationRequest{AgentCommand: []string{"agent"}}, &conv); err != nil {
		t.Fatal(err)
	}
	var job wire.Job
	if _, err := wc.Do(ctx, http.MethodPost, "/v1/conversations/"+conv.ID+"/messages", tok, wire.SendMessageRequest{Prompt: "hi"}, &job); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runCmd(t, env, "conversation", "delete", conv.ID)
	if code != exitFail || !strings.Contains(stderr, "cancel it first") {
		t.Fatalf("delete with a waiting turn: exit %d, stderr %q", code, stderr)
	}
	if _, err := wc.Do(ctx, http.MethodPost, "/v1/jobs/"+job.ID+"/cancel", tok, nil, nil); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runCmd(t, env, "conversation", "delete", conv.ID)
	if code != exitOK || !strings.Contains(stdout, "conversation "+conv.ID+" deleted") {
		t.Fatalf("delete: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	_, err := wc.Do(ctx, http.MethodPost, "/v1/conversations/"+conv.ID+"/messages", tok, wire.SendMessageRequest{Prompt: "again"}, nil)
	if se, ok := err.(*wire.StatusError); !ok || se.Status != http.StatusGone || se.Code != wire.CodeGone {
		t.Fatalf("message after delete: %v, want 410 gone", err)
	}
	if code, _, stderr := runCmd(t, env, "conversation", "delete", "conv_nobody"); code != exitFail || !strings.Contains(stderr, "404") {
		t.Fatalf("delete of an unknown id: exit %d, stderr %q", code, stderr)
	}
	if code, _, stderr := runCmd(t, env, "conversation", "delete"); code != exitUsage || !strings.Contains(stderr, "missing the conversation's ID") {
		t.Fatalf("delete without ID: exit %d, stderr %q", code, stderr)
	}
}
