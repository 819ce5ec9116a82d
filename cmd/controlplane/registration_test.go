package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runnerd/runnerd/wire"
)

// `controlplane registration-token create|list|revoke` against a real
// serve: the token (in a 0600 file) registers one host with a granted
// label, is refused past its max uses with the server's reason, lists
// with its uses, grants and revocation (never the token), and its
// revocation leaves the registered host working. Bad flags are one line
// and exit 2. `host rotate-token` with the default grace shows no token;
// the host's next heartbeat answer carries it.
func TestRegistrationTokenCommands(t *testing.T) {
	dir := t.TempDir()
	s := startServe(t, "--data-dir", dir)
	file := filepath.Join(t.TempDir(), "reg-token")
	code, stdout, stderr := runCmd(t, noEnv, "registration-token", "create", "fleet", "--data-dir", dir,
		"--max-uses", "1", "--expires", "1h", "--label", "pool=a", "--token-file", file)
	if code != exitOK || stdout != "" || !strings.Contains(stderr, "registration token rtok_") {
		t.Fatalf("registration-token create: %d %q %q", code, stdout, stderr)
	}
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v %v", fi, err)
	}
	reg := readToken(t, file)
	if !strings.HasPrefix(reg, "rdr_") {
		t.Fatalf("registration token %q…", reg[:4])
	}

	ctx := context.Background()
	wc := &wire.Client{BaseURL: s.addr}
	r1, err := wc.Register(ctx, reg, wire.RegisterRequest{Name: "img-1", Labels: wire.Labels{"pool": "a"}, Version: "test"})
	if err != nil {
		t.Fatalf("register: %v", err)
	}
	_, err = wc.Register(ctx, reg, wire.RegisterRequest{Name: "img-2"})
	if se, ok := err.(*wire.StatusError); !ok || se.Code != wire.CodeRegistrationUsedUp || !strings.Contains(se.Message, "registration-token create") {
		t.Fatalf("a second registration with a max-uses-1 token: %v", err)
	}

	code, stdout, _ = runCmd(t, noEnv, "registration-token", "list", "--data-dir", dir)
	if code != exitOK || !regexpLine(stdout, `rtok_\S+\s+fleet\s+pool=a\s+1/1\s+20\d\d-\S+\s+\S+\s+-$`) || strings.Contains(stdout, reg) {
		t.Fatalf("registration-token list: %d\n%s", code, stdout)
	}
	id := strings.Fields(strings.Split(stdout, "\n")[1])[0]
	if code, _, stderr := runCmd(t, noEnv, "registration-token", "revoke", id, "--data-dir", dir); code != exitOK || !strings.Contains(stderr, "keep their own tokens") {
		t.Fatalf("registration-token revoke: %d %s", code, stderr)
	}
	if code, stdout, _ := runCmd(t, noEnv, "registration-token", "list", "--data-dir", dir); code != exitOK || regexpLine(stdout, `\s-$`) {
		t.Fatalf("a revoked token lists as not revoked:\n%s", stdout)
	}
	if _, err := wc.HostHeartbeat(ctx, r1.HostToken, wire.HostHeartbeat{Capacity: 1}); err != nil {
		t.Fatalf("a host registered by a revoked token: %v", err)
	}

	env := envOf(t, map[string]string{"CONTROLPLANE_SERVER": s.addr, "CONTROLPLANE_DATA_DIR": dir})
	code, stdout, stderr = runCmd(t, env, "host", "rotate-token", "img-1")
	if code != exitOK || stdout != "" || !strings.Contains(stderr, "next heartbeat") {
		t.Fatalf("rotate-token with the default grace: %d %q %q", code, stdout, stderr)
	}
	hb, err := wc.HostHeartbeat(ctx, r1.HostToken, wire.HostHeartbeat{Capacity: 1})
	if err != nil || !strings.HasPrefix(hb.HostToken, "rdh_") {
		t.Fatalf("heartbeat in the grace: %+v, %v", hb, err)
	}
	if _, err := wc.HostHeartbeat(ctx, hb.HostToken, wire.HostHeartbeat{Capacity: 1}); err != nil {
		t.Fatalf("the rotated token: %v", err)
	}
	if code, _, stderr := runCmd(t, env, "host", "rotate-token", "img-1", "--grace", "-1s"); code != exitUsage || strings.Count(stderr, "\n") != 1 {
		t.Fatalf("a negative --grace: %d %q", code, stderr)
	}
	for _, s := range []string{reg, r1.HostToken, hb.HostToken} {
		if strings.Contains(stdout+stderr, s) {
			t.Fatal("a token was printed")
		}
	}

	for _, bad := range [][]string{
		{"create", "x", "--max-uses", "-1"},
		{"create", "x", "--expires", "-1h"},
		{"create", "x", "--label", "os=linux"},
		{"create", "x", "--label", "pool"},
		{"create", "x", "--label", "Bad Key=1"},
		{"revoke"},
		{"frob"},
	} {
		code, _, stderr := runCmd(t, noEnv, append(append([]string{"registration-token"}, bad...), "--data-dir", dir)...)
		if code != exitUsage || strings.Count(stderr, "\n") != 1 {
			t.Errorf("registration-token %v: %d %q; want one line and exit 2", bad, code, stderr)
		}
	}
	if code, _, stderr := runCmd(t, noEnv, "registration-token", "revoke", "rtok_nobody", "--data-dir", dir); code != exitFail || !strings.Contains(stderr, "no registration token") {
		t.Errorf("revoke of an unknown id: %d %q", code, stderr)
	}
	if code, _, stderr := runCmd(t, noEnv, "registration-token", "list", "--data-dir", t.TempDir()); code == exitOK {
		t.Errorf("list with no database: %d %q; want a refusal", code, stderr)
	}
}
