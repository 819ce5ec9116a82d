package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/runnerd/runnerd/wire"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The host lifecycle through `controlplane host …` against a real serve:
// list shows a host that never heartbeated as offline and one that did as
// online; pause keeps a queued turn from the host while its running turn
// still renews, resume gives it the turn; rotate-token refuses the old
// token and accepts the new; remove refuses the token and drops the host
// from the list. Unknown hosts are one clear line and exit 1. /healthz,
// /readyz and /metrics answer without a token, /metrics with the hosts
// by state and the build; --log-format json writes JSON records.
func TestHostLifecycleCommands(t *testing.T) {
	dir := t.TempDir()
	s := startServe(t, "--data-dir", dir, "--log-format", "json")
	env := envOf(t, map[string]string{"CONTROLPLANE_SERVER": s.addr, "CONTROLPLANE_DATA_DIR": dir})
	host := func(args ...string) (int, string, string) {
		t.Helper()
		return runCmd(t, env, append([]string{"host"}, args...)...)
	}
	code, stdout, stderr := runCmd(t, noEnv, "host", "add", "host-1", "--data-dir", dir)
	if code != exitOK {
		t.Fatalf("host add: %d %s", code, stderr)
	}
	token := strings.TrimSpace(stdout)
	if code, stdout, _ := host("list"); code != exitOK || !regexpLine(stdout, `host-1\s+offline\s+never`) {
		t.Fatalf("host list before a heartbeat: %d\n%s", code, stdout)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body := get(t, s.addr+path); code != http.StatusOK {
			t.Fatalf("%s = %d %s", path, code, body)
		}
	}
	if _, body := get(t, s.addr+"/metrics"); !strings.Contains(body, `controlplane_hosts{state="offline"} 1`) ||
		!strings.Contains(body, `controlplane_build_info{goversion="go`) || !strings.Contains(body, "go_goroutines") {
		t.Fatalf("/metrics:\n%s", body)
	}

	ctx := context.Background()
	wc := &wire.Client{BaseURL: s.addr}
	if _, err := wc.HostHeartbeat(ctx, token, wire.HostHeartbeat{Capacity: 2, IntervalMS: 60_000}); err != nil {
		t.Fatal(err)
	}
	if code, stdout, _ := host("list"); code != exitOK || !regexpLine(stdout, `host-1\s+online\s+\d+s ago\s+0/2`) {
		t.Fatalf("host list after a heartbeat: %d\n%s", code, stdout)
	}

	// Two turns: one runs before the pause, one is queued during it.
	user := func(method, path string, body, out any) {
		t.Helper()
		if _, err := wc.Do(ctx, method, path, readUserToken(t, dir), body, out); err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
	}
	for range 2 {
		var conv wire.Conversation
		user(http.MethodPost, "/v1/conversations", wire.CreateConversationRequest{Image: "i", AgentCommand: []string{"a"}}, &conv)
		user(http.MethodPost, "/v1/conversations/"+conv.ID+"/messages", wire.SendMessageRequest{Prompt: "p"}, nil)
	}
	running, err := wc.Claim(ctx, token, wire.ClaimRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if code, stdout, stderr := host("pause", "host-1"); code != exitOK || !regexpLine(stdout, `host-1\s+paused`) {
		t.Fatalf("host pause: %d\n%s%s", code, stdout, stderr)
	}
	if _, err := wc.Claim(ctx, token, wire.ClaimRequest{WaitMS: 300}); !errors.Is(err, wire.ErrNoClaim) {
		t.Fatalf("a paused host's claim: %v, want none", err)
	}
	ref := wire.AttemptRef{AttemptID: running.AttemptID, LeaseGeneration: running.LeaseGeneration}
	if _, err := wc.Renew(ctx, running.WorkerToken, running.JobID, wire.RenewRequest{AttemptRef: ref}); err != nil {
		t.Fatalf("a paused host's running turn could not renew: %v", err)
	}
	if code, _, stderr := host("resume", "host-1"); code != exitOK {
		t.Fatalf("host resume: %d %s", code, stderr)
	}
	if _, err := wc.Claim(ctx, token, wire.ClaimRequest{}); err != nil {
		t.Fatalf("a resumed host's claim: %v", err)
	}

	code, stdout, stderr = host("rotate-token", "host-1", "--grace", "0")
	newToken := strings.TrimSpace(stdout)
	if code != exitOK || !strings.HasPrefix(newToken, "rdh_") || newToken == token {
		t.Fatalf("rotate-token: %d %q %s", code, stdout, stderr)
	}
	if _, err := wc.HostHeartbeat(ctx, token, wire.HostHeartbeat{}); wireStatus(err) != http.StatusUnauthorized {
		t.Fatalf("the old token after rotation: %v", err)
	}
	if _, err := wc.HostHeartbeat(ctx, newToken, wire.HostHeartbeat{Capacity: 2}); err != nil {
		t.Fatalf("the new token: %v", err)
	}
	if code, _, stderr := host("remove", "host-1"); code != exitUsage || !strings.Contains(stderr, "--reason is required") {
		t.Fatalf("host remove without --reason: %d %s", code, stderr)
	}
	if _, err := wc.HostHeartbeat(ctx, newToken, wire.HostHeartbeat{Capacity: 2}); err != nil {
		t.Fatalf("a remove refused for its missing reason removed the host: %v", err)
	}
	if code, _, stderr := host("remove", "host-1", "--reason", "decommissioned"); code != exitOK {
		t.Fatalf("host remove: %d %s", code, stderr)
	}
	if _, err := wc.Claim(ctx, newToken, wire.ClaimRequest{}); wireStatus(err) != http.StatusUnauthorized {
		t.Fatalf("a removed host's claim: %v", err)
	}
	if code, stdout, _ := host("list", "--json"); code != exitOK || !strings.Contains(stdout, `"servers":[]`) {
		t.Fatalf("host list after remove: %d %s", code, stdout)
	}
	if code, _, stderr := host("pause", "host-1"); code != exitFail || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "404") {
		t.Fatalf("pause of a removed host: %d %q", code, stderr)
	}

	// Host admin calls take the token as a bearer header only: a browser's
	// cached Basic credentials cannot drive them from another site.
	req, _ := http.NewRequest(http.MethodPost, s.addr+"/v1/admin/hosts/host-1/pause", strings.NewReader("{}"))
	req.SetBasicAuth("admin", readUserToken(t, dir))
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("Basic auth on a host action: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	s.stop()
	var records int
	for _, line := range strings.Split(strings.TrimSpace(s.logs.String()), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] != nil {
			records++
			if rec["msg"] == "controlplane_host_changed" && rec["action"] == nil {
				t.Errorf("host record without its action: %s", line)
			}
		}
		for _, secret := range []string{token, newToken} {
			if strings.Contains(line, secret) {
				t.Fatal("a host token reached the log")
			}
		}
	}
	if records == 0 || !strings.Contains(s.logs.String(), `"msg":"controlplane_host_changed"`) {
		t.Fatalf("no JSON records with --log-format json:\n%s", s.logs)
	}
}

// regexpLine reports whether a line of out matches re.
func regexpLine(out, re string) bool {
	rx := regexp.MustCompile(re)
	for _, line := range strings.Split(out, "\n") {
		if rx.MatchString(line) {
			return true
		}
	}
	return false
}

func readUserToken(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "user-token"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// wireStatus is the HTTP status of a wire call's error, 0 for none.
func wireStatus(err error) int {
	var se *wire.StatusError
	if errors.As(err, &se) {
		return se.Status
	}
	return 0
}
