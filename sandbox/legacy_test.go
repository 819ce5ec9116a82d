package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// AdoptLegacyState moves the previous release's native turn out of the
// workspace once, never overwrites a state of this release, and refuses,
// without following it, a symlink the agent may have planted (a backend
// reads a container's workspace from the host).
func TestAdoptLegacyStateMovesOnlyAPlainNumberOnce(t *testing.T) {
	setup := func(t *testing.T) (ws, state, legacy string) {
		dir := t.TempDir()
		ws, state = filepath.Join(dir, "ws"), filepath.Join(dir, "state")
		legacy = filepath.Join(ws, LegacyStateDir, NativeTurnFile)
		if err := os.MkdirAll(filepath.Dir(legacy), 0o700); err != nil {
			t.Fatal(err)
		}
		return ws, state, legacy
	}
	read := func(t *testing.T, state string) string {
		b, err := os.ReadFile(filepath.Join(state, NativeTurnFile))
		if err != nil {
			return "<" + err.Error() + ">"
		}
		return strings.TrimSpace(string(b))
	}

	t.Run("moved", func(t *testing.T) {
		ws, state, legacy := setup(t)
		_ = os.WriteFile(legacy, []byte("7\n"), 0o600)
		if moved, err := AdoptLegacyState(ws, state); !moved || err != nil || read(t, state) != "7" {
			t.Fatalf("moved %v, %v, state %s; want 7 moved", moved, err, read(t, state))
		}
		if _, err := os.Lstat(legacy); !os.IsNotExist(err) {
			t.Fatalf("legacy file left in the workspace: %v", err)
		}
	})
	t.Run("never over this release's state", func(t *testing.T) {
		ws, state, legacy := setup(t)
		_ = os.WriteFile(legacy, []byte("999\n"), 0o600)
		_ = os.MkdirAll(state, 0o700)
		_ = os.WriteFile(filepath.Join(state, NativeTurnFile), []byte("2\n"), 0o600)
		if moved, err := AdoptLegacyState(ws, state); moved || err != nil || read(t, state) != "2" {
			t.Fatalf("moved %v, %v, state %s; want 2 kept", moved, err, read(t, state))
		}
	})
	t.Run("nothing to move", func(t *testing.T) {
		dir := t.TempDir()
		if moved, err := AdoptLegacyState(filepath.Join(dir, "ws"), filepath.Join(dir, "state")); moved || err != nil {
			t.Fatalf("moved %v, %v; want nothing", moved, err)
		}
	})
	t.Run("symlinked file refused", func(t *testing.T) {
		ws, state, legacy := setup(t)
		target := filepath.Join(t.TempDir(), "elsewhere")
		_ = os.WriteFile(target, []byte("5\n"), 0o600)
		_ = os.Symlink(target, legacy)
		if moved, err := AdoptLegacyState(ws, state); moved || err == nil {
			t.Fatalf("moved %v, %v; want a symlink refused", moved, err)
		}
		if _, err := os.Stat(target); err != nil {
			t.Fatalf("the symlink's target was touched: %v", err)
		}
	})
	t.Run("symlinked directory refused", func(t *testing.T) {
		dir := t.TempDir()
		ws, state := filepath.Join(dir, "ws"), filepath.Join(dir, "state")
		elsewhere := filepath.Join(dir, "elsewhere")
		_ = os.MkdirAll(elsewhere, 0o700)
		_ = os.MkdirAll(ws, 0o700)
		_ = os.WriteFile(filepath.Join(elsewhere, NativeTurnFile), []byte("5\n"), 0o600)
		_ = os.Symlink(elsewhere, filepath.Join(ws, LegacyStateDir))
		if moved, err := AdoptLegacyState(ws, state); moved || err == nil {
			t.Fatalf("moved %v, %v; want the symlinked directory refused", moved, err)
		}
		if _, err := os.Stat(filepath.Join(elsewhere, NativeTurnFile)); err != nil {
			t.Fatalf("the file behind the symlink was removed: %v", err)
		}
	})
	t.Run("not a number", func(t *testing.T) {
		ws, state, legacy := setup(t)
		_ = os.WriteFile(legacy, []byte("lots\n"), 0o600)
		if moved, err := AdoptLegacyState(ws, state); moved || err == nil {
			t.Fatalf("moved %v, %v; want refused", moved, err)
		}
	})
}
