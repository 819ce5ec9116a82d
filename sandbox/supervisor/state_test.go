package supervisor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The supervisor never keeps its state inside the workspace, where the
// agent writes: such a configuration is refused, and the
// default is beside the workspace.
func TestStateDirIsNeverInsideTheWorkspace(t *testing.T) {
	dir := t.TempDir()
	ws := filepath.Join(dir, "workspace")
	for _, state := range []string{ws, filepath.Join(ws, ".runnerd"), filepath.Join(ws, "a", "..", "b")} {
		err := Serve(context.Background(), Config{Socket: filepath.Join(dir, "s.sock"), Workspace: ws, StateDir: state})
		if err == nil || !strings.Contains(err.Error(), "inside the workspace") {
			t.Errorf("state dir %s: serve = %v, want refused", state, err)
		}
	}
	s := startServe(t)
	runTurn(t, s.c, "one")
	b, err := os.ReadFile(filepath.Join(filepath.Dir(s.ws), "supervisor-state", nativeTurnFile))
	if err != nil || strings.TrimSpace(string(b)) != "1" {
		t.Fatalf("default state file: %q, %v; want 1 beside the workspace", b, err)
	}
	if _, err := os.Stat(filepath.Join(s.ws, ".runnerd")); !os.IsNotExist(err) {
		t.Fatalf("the supervisor wrote into the workspace's .runnerd: %v", err)
	}
}

// --agent-user resolves like the engine's USER and never to root.
func TestAgentUserIsNeverRoot(t *testing.T) {
	for _, spec := range []string{"0", "root", "0:4242"} {
		if c, err := lookupCredential(spec); err == nil {
			t.Errorf("--agent-user %s = %+v, want refused", spec, c)
		}
	}
	c, err := lookupCredential("4242:4343")
	if err != nil || c.Uid != 4242 || c.Gid != 4343 || len(c.Groups) != 0 {
		t.Fatalf("--agent-user 4242:4343 = %+v, %v", c, err)
	}
	if _, err := lookupCredential("no-such-user-here"); err == nil {
		t.Error("an unknown user name was accepted")
	}
}
