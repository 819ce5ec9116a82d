package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os/user"
	"regexp"
	"strings"
	"testing"

	"github.com/runnerd/runnerd/wire"
)

// The audit through the CLI against a real serve: the database commands
// (host add, token create|revoke, registration-token create|revoke, and
// serve's first user token) record the OS user as cli:NAME, looked up by
// uid whatever $USER says; conversation lose needs --reason (exit 2, no
// call) and records the user token's name; audit list shows every row in
// JSON or a table, filters by target and action, and a filter the server
// refuses is its message and exit 1; a bad --output is exit 2.
func TestAuditCommandsRecordActorsAndListThem(t *testing.T) {
	dir := t.TempDir()
	s := startServe(t, "--data-dir", dir)
	t.Setenv("USER", "someone-else") // the actor is the uid's name, not $USER
	env := envOf(t, map[string]string{"CONTROLPLANE_SERVER": s.addr, "CONTROLPLANE_DATA_DIR": dir})
	u, err := user.Current()
	if err != nil {
		t.Fatalf("os/user: %v", err)
	}
	me := "cli:" + u.Username
	must := func(args ...string) string {
		t.Helper()
		code, stdout, stderr := runCmd(t, env, args...)
		if code != exitOK {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
		return stdout + stderr
	}
	must("host", "add", "host-1", "--reason", "rack 4")
	must("token", "create", "ci", "--token-file", dir+"/ci-token")
	utok := regexpFind(t, must("token", "list"), `(utok_\S+)\s+ci\s`)
	must("token", "revoke", utok)
	must("registration-token", "create", "fleet", "--token-file", dir+"/reg-token")
	rtok := regexpFind(t, must("registration-token", "list"), `(rtok_\S+)\s+fleet\s`)
	must("registration-token", "revoke", rtok)

	ctx := context.Background()
	wc := &wire.Client{BaseURL: s.addr}
	var conv wire.Conversation
	if _, err := wc.Do(ctx, http.MethodPost, "/v1/conversations", readUserToken(t, dir), wire.CreateConversationRequest{AgentCommand: []string{"agent"}}, &conv); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"conversation", "lose", conv.ID}, {"conversation", "lose", conv.ID, "--reason", " "}} {
		if code, _, stderr := runCmd(t, env, args...); code != exitUsage || !strings.Contains(stderr, "--reason is required") {
			t.Fatalf("%v: exit %d, stderr %q; want 2 naming --reason", args, code, stderr)
		}
	}
	if out := must("conversation", "lose", conv.ID, "--reason", "host-9 is gone"); !strings.Contains(out, "lost") {
		t.Fatalf("conversation lose: %s", out)
	}

	code, stdout, stderr := runCmd(t, env, "audit", "list", "--output", "json")
	if code != exitOK {
		t.Fatalf("audit list: exit %d: %s", code, stderr)
	}
	var l wire.AuditList
	if err := json.Unmarshal([]byte(stdout), &l); err != nil {
		t.Fatalf("audit list --output json: %v\n%s", err, stdout)
	}
	type row struct{ actor, action, target, reason string }
	want := []row{
		{"first start", wire.AuditConversationLose, conv.ID, "host-9 is gone"},
		{me, wire.AuditRegistrationTokenRevoke, rtok, ""},
		{me, wire.AuditRegistrationTokenCreate, rtok, ""},
		{me, wire.AuditUserTokenRevoke, utok, ""},
		{me, wire.AuditUserTokenCreate, utok, ""},
		{me, wire.AuditHostAdd, "host-1", "rack 4"},
		{me, wire.AuditUserTokenCreate, "", "first start: no user token yet"}, // serve's first token; its id below
	}
	if len(l.Entries) != len(want) {
		t.Fatalf("audit = %+v, want %d rows", l.Entries, len(want))
	}
	for i, e := range l.Entries {
		w := want[i]
		if w.target == "" {
			w.target = e.Target
		}
		if got := (row{e.Actor, e.Action, e.Target, e.Reason}); got != w || e.At.IsZero() {
			t.Errorf("audit[%d] = %+v at %s, want %+v", i, got, e.At, w)
		}
	}
	if strings.Contains(stdout, "someone-else") || strings.Contains(stdout, "rdu_") {
		t.Fatalf("the audit holds $USER or a token:\n%s", stdout)
	}
	out := must("audit", "list", "--target", "host-1")
	if !regexpLine(out, `^AT\s+ACTOR\s+ACTION\s+TARGET\s+REASON`) || !regexpLine(out, `\S+\s+`+me+`\s+host\.add\s+host-1\s+rack 4$`) || strings.Contains(out, "token") {
		t.Fatalf("audit list --target host-1:\n%s", out)
	}
	if out := must("audit", "list", "--action", wire.AuditConversationLose, "--output", "json"); strings.Count(out, `"action"`) != 1 {
		t.Fatalf("audit list --action: %s", out)
	}
	for _, bad := range [][]string{{"--action", "host.explode"}, {"--since", "yesterday"}, {"--limit", "501"}, {"--target", "a b"}} {
		code, _, stderr := runCmd(t, env, append([]string{"audit", "list"}, bad...)...)
		if code != exitFail || !strings.Contains(stderr, "400") || !strings.Contains(stderr, strings.TrimPrefix(bad[0], "--")) {
			t.Errorf("audit list %v: exit %d, stderr %q; want 1 with the server's message", bad, code, stderr)
		}
	}
	if code, _, stderr := runCmd(t, env, "audit", "list", "--output", "yaml"); code != exitUsage {
		t.Errorf("audit list --output yaml: exit %d, %q", code, stderr)
	}
	if code, _, _ := runCmd(t, env, "audit"); code != exitUsage {
		t.Errorf("audit without list: exit %d", code)
	}
}

// regexpFind is re's first group in out, or the test fails.
func regexpFind(t *testing.T, out, re string) string {
	t.Helper()
	m := regexp.MustCompile(re).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no %s in:\n%s", re, out)
	}
	return m[1]
}
