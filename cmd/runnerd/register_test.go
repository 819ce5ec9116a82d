package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore"
)

// --registration-token-file (or RUNNERD_REGISTRATION_TOKEN_FILE) puts the
// host token in STATE_DIR/host-token unless --host-token-file is given.
// Against a real control plane, a registration token it does not know
// ends `runnerd run` with exit 3 (RestartPreventExitStatus) and the
// server's reason, no token file and no token on stderr.
func TestRegistrationTokenFile(t *testing.T) {
	state := t.TempDir()
	o, err := parseRun([]string{"--state-dir", state}, env(t, "RUNNERD_REGISTRATION_TOKEN_FILE", "/etc/runnerd/registration-token"))
	if err != nil || o.regFile != "/etc/runnerd/registration-token" || o.tokenFile != filepath.Join(state, "host-token") {
		t.Fatalf("parseRun = %+v, %v", o, err)
	}
	if o, err := parseRun([]string{"--state-dir", state, "--registration-token-file", "r", "--host-token-file", "/x/tok"}, env(t)); err != nil || o.tokenFile != "/x/tok" {
		t.Fatalf("an explicit --host-token-file = %q, %v", o.tokenFile, err)
	}

	st, err := sqlstore.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	hs := httptest.NewServer(controlplane.New(controlplane.Config{Store: st, Logger: slog.New(slog.DiscardHandler)}).Handler())
	defer hs.Close()
	reg := filepath.Join(t.TempDir(), "reg")
	const secret = "rdr_not-a-token-the-control-plane-knows"
	if err := os.WriteFile(reg, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := runDaemon([]string{"--control-plane", hs.URL, "--state-dir", state, "--registration-token-file", reg, "--host-name", "img-1"}, env(t), &stdout, &stderr)
	if code != exitHostTokenRefused || !strings.Contains(stderr.String(), "refused to register host img-1 (401 unauthorized)") ||
		strings.Contains(stderr.String(), secret) {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr.String())
	}
	if _, err := os.Stat(filepath.Join(state, "host-token")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused registration left a host token file: %v", err)
	}
}
