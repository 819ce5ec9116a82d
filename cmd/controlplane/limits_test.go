package main

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/runnerd/runnerd/wire"
)

// `controlplane submit --new --limit cpus=…,memory_bytes=…,pids=…` against
// a real serve: the conversation is created with those limits; an
// unknown key or a value that is not a number is a usage error before
// any call; a limit the control plane refuses (disk_bytes) exits 1 with
// the server's reason; --limit without --new is a usage error.
func TestSubmitLimitFlag(t *testing.T) {
	dir := t.TempDir()
	s := startServe(t, "--data-dir", dir)
	env := envOf(t, map[string]string{"CONTROLPLANE_SERVER": s.addr, "CONTROLPLANE_DATA_DIR": dir})
	code, stdout, stderr := runCmd(t, env, "submit", "--new", "--agent", "agent", "--prompt", "hi", "--follow=false",
		"--limit", "cpus=0.5,memory_bytes=268435456,pids=16")
	if code != exitOK {
		t.Fatalf("submit --limit: exit %d, stderr %q", code, stderr)
	}
	id, _, _ := strings.Cut(strings.TrimPrefix(stdout, "conversation "), "\n")
	var conv wire.Conversation
	if _, err := (&wire.Client{BaseURL: s.addr}).Do(context.Background(), http.MethodGet, "/v1/conversations/"+id, readUserToken(t, dir), nil, &conv); err != nil {
		t.Fatal(err)
	}
	if want := (wire.Limits{CPUs: 0.5, MemoryBytes: 256 << 20, Pids: 16}); conv.Limits != want {
		t.Fatalf("conversation %s has limits %+v, want %+v", id, conv.Limits, want)
	}
	for _, tc := range []struct {
		args []string
		exit int
		says string
	}{
		{[]string{"--new", "--agent", "a", "--prompt", "p", "--limit", "gpus=1"}, exitUsage, `unknown limit "gpus"`},
		{[]string{"--new", "--agent", "a", "--prompt", "p", "--limit", "pids=many"}, exitUsage, "not a number"},
		{[]string{"--new", "--agent", "a", "--prompt", "p", "--limit", "pids"}, exitUsage, "key=value"},
		{[]string{"--conversation", id, "--prompt", "p", "--limit", "pids=4"}, exitUsage, "--new conversations only"},
		{[]string{"--new", "--agent", "a", "--prompt", "p", "--limit", "disk_bytes=1073741824"}, exitFail, "unsupported"},
	} {
		code, _, stderr := runCmd(t, env, append([]string{"submit"}, tc.args...)...)
		if code != tc.exit || !strings.Contains(stderr, tc.says) {
			t.Errorf("submit %v: exit %d, stderr %q; want exit %d saying %q", tc.args, code, stderr, tc.exit, tc.says)
		}
	}
}
