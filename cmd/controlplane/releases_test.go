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

// K7: --max-releases reaches the store. With a cap of 2 (the store's own
// default is 5) a job released twice is queued again each time and the
// third release fails it, its reason naming the last release's class.
func TestMaxReleasesReachesTheStore(t *testing.T) {
	dir := t.TempDir()
	r := startServe(t, "--data-dir", dir, "--max-releases", "2", "--release-backoff", "1ms", "--claim-recheck", "10ms")
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
	var job wire.Job
	if _, err := wc.Do(ctx, "POST", "/v1/conversations/"+conv.ID+"/messages", userToken, wire.SendMessageRequest{Prompt: "hello"}, &job); err != nil {
		t.Fatal(err)
	}
	const class = "declined:agent_missing"
	for n := 1; n <= 3; n++ {
		// The long poll outlasts the release backoff, found by the re-check.
		c, err := wc.Claim(ctx, hostToken, wire.ClaimRequest{WaitMS: 30_000})
		if err != nil {
			t.Fatalf("claim %d: %v", n, err)
		}
		if err := wc.Release(ctx, c.WorkerToken, c.JobID, wire.ReleaseRequest{
			AttemptRef: wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}, Class: class,
		}); err != nil {
			t.Fatalf("release %d: %v", n, err)
		}
		var j wire.Job
		if _, err := wc.Do(ctx, "GET", "/v1/jobs/"+job.ID, userToken, nil, &j); err != nil {
			t.Fatal(err)
		}
		want := wire.JobQueued
		if n == 3 {
			want = wire.JobFailed
		}
		if j.State != want {
			t.Fatalf("after release %d with --max-releases 2 the job is %s, want %s", n, j.State, want)
		}
		if n == 3 && !strings.Contains(j.Reason, class) {
			t.Fatalf("the job failed past the cap with reason %q, want the last release's class %s", j.Reason, class)
		}
	}
}
