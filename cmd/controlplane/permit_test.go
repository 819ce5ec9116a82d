package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// A4: `controlplane permit JOB REQUEST OPTION` against a real serve
// answers a running ACP turn's pending permission request; the turn's
// poll then gets the option. Its refusals are one line in the server's
// own words with exit 1: an option the request did not offer, an answer
// to a request no longer pending, an unknown job. A wrong number of
// arguments is a usage error (exit 2).
func TestPermitCommand(t *testing.T) {
	dir := t.TempDir()
	s := startServe(t, "--data-dir", dir)
	env := envOf(t, map[string]string{"CONTROLPLANE_SERVER": s.addr, "CONTROLPLANE_DATA_DIR": dir})
	code, stdout, stderr := runCmd(t, noEnv, "host", "add", "host-1", "--data-dir", dir)
	if code != exitOK {
		t.Fatalf("host add: %d %s", code, stderr)
	}
	hostToken := strings.TrimSpace(stdout)
	ctx := context.Background()
	wc := &wire.Client{BaseURL: s.addr}
	var conv wire.Conversation
	if _, err := wc.Do(ctx, http.MethodPost, "/v1/conversations", readUserToken(t, dir), wire.CreateConversationRequest{
		Image: "i", AgentCommand: []string{"a"}, AgentProtocol: wire.AgentProtocolACP}, &conv); err != nil {
		t.Fatal(err)
	}
	if _, err := wc.Do(ctx, http.MethodPost, "/v1/conversations/"+conv.ID+"/messages", readUserToken(t, dir), wire.SendMessageRequest{Prompt: "p"}, nil); err != nil {
		t.Fatal(err)
	}
	cl, err := wc.Claim(ctx, hostToken, wire.ClaimRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ref := wire.AttemptRef{AttemptID: cl.AttemptID, LeaseGeneration: cl.LeaseGeneration}
	if _, err := wc.Events(ctx, cl.WorkerToken, cl.JobID, wire.EventsRequest{AttemptRef: ref, Events: []wire.Event{{Seq: 1, Time: time.Now(),
		Type: wire.EventPermissionRequested, Data: json.RawMessage(`{"request_id":"perm-1","policy":"ask","tool_call":{"toolCallId":"call_1"},` +
			`"options":[{"optionId":"allow","name":"Allow","kind":"allow_once"},{"optionId":"reject","name":"Reject","kind":"reject_once"}]}`)}}}); err != nil {
		t.Fatal(err)
	}

	if code, _, stderr := runCmd(t, env, "permit", cl.JobID, "perm-1"); code != exitUsage || !strings.Contains(stderr, "JOB REQUEST OPTION") {
		t.Fatalf("permit with two arguments: %d %s", code, stderr)
	}
	if code, _, stderr := runCmd(t, env, "permit", cl.JobID, "perm-1", "maybe"); code != exitFail ||
		!strings.Contains(stderr, `option_id "maybe" is not one of the request's options`) || !strings.Contains(stderr, "400 invalid") {
		t.Fatalf("permit with an unknown option: %d %s", code, stderr)
	}
	if code, stdout, stderr := runCmd(t, env, "permit", cl.JobID, "perm-1", "reject"); code != exitOK || !strings.Contains(stdout, "answered reject") {
		t.Fatalf("permit: %d %s%s", code, stdout, stderr)
	}
	opt, err := wc.PermissionAnswer(ctx, cl.WorkerToken, cl.JobID, wire.PermissionsRequest{AttemptRef: ref, RequestID: "perm-1"})
	if err != nil || opt != "reject" {
		t.Fatalf("the turn's poll = %q, %v; want reject", opt, err)
	}
	if code, _, stderr := runCmd(t, env, "permit", cl.JobID, "perm-1", "allow"); code != exitFail ||
		!strings.Contains(stderr, "not waiting for an answer") || !strings.Contains(stderr, "409 not_pending") {
		t.Fatalf("permit of an answered request: %d %s", code, stderr)
	}
	if code, _, stderr := runCmd(t, env, "permit", "job_nope", "perm-1", "allow"); code != exitFail || !strings.Contains(stderr, "404 not_found") {
		t.Fatalf("permit of an unknown job: %d %s", code, stderr)
	}
}
