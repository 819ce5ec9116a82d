package main

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// --max-worker-lost caps a daemon's worker_lost reports as well as the
// reaper's: with a cap of 1 the job is queued again after its first host
// loss and fails at its second (the store's own default of 3 would queue
// it again).
func TestMaxWorkerLostReachesFinish(t *testing.T) {
	dir := t.TempDir()
	r := startServe(t, "--data-dir", dir, "--max-worker-lost", "1")
	code, stdout, stderr := runCmd(t, noEnv, "host", "add", "host-1", "--data-dir", dir)
	if code != exitOK {
		t.Fatalf("host add: exit %d %s", code, stderr)
	}
	hostToken := strings.TrimSpace(stdout)
	tok, err := os.ReadFile(filepath.Join(dir, "user-token"))
	if err != nil {
		t.Fatal(err)
	}
	userToken := strings.TrimSpace(string(tok))
	ctx := context.Background()
	wc := &wire.Client{BaseURL: r.addr, HTTP: &http.Client{Timeout: time.Minute}}
	var conv wire.Conversation
	if _, err := wc.Do(ctx, "POST", "/v1/conversations", userToken,
		wire.CreateConversationRequest{Image: "demo", AgentCommand: []string{"demo-agent"}}, &conv); err != nil {
		t.Fatal(err)
	}
	if _, err := wc.Do(ctx, "POST", "/v1/conversations/"+conv.ID+"/messages", userToken, wire.SendMessageRequest{Prompt: "hello"}, nil); err != nil {
		t.Fatal(err)
	}
	lose := func() string {
		t.Helper()
		c, err := wc.Claim(ctx, hostToken, wire.ClaimRequest{})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := wc.Finish(ctx, c.WorkerToken, c.JobID, wire.FinishRequest{
			AttemptRef: wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration},
			Outcome:    wire.OutcomeWorkerLost, Class: "worker_lost",
		})
		if err != nil {
			t.Fatal(err)
		}
		return resp.JobState
	}
	if got := lose(); got != wire.JobQueued {
		t.Fatalf("the first host loss left the job %s, want it queued again", got)
	}
	if got := lose(); got != wire.JobFailed {
		t.Fatalf("a second host loss past --max-worker-lost 1 left the job %s", got)
	}
}
