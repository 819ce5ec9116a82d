package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/runnerd/runnerd/internal/atomicfile/stracetest"
)

// TestS7AdoptedNativeTurnIsDurable: under strace, moving the previous
// release's native turn into the state directory (as both backends do
// before a supervisor starts) writes it to a temporary file, syncs it,
// renames it and syncs the state directory before the legacy file is
// removed and AdoptLegacyState returns.
func TestS7AdoptedNativeTurnIsDurable(t *testing.T) {
	stracetest.Durable(t, func(dir string) error {
		ws, state := filepath.Join(dir, "ws"), filepath.Join(dir, "state")
		legacy := filepath.Join(ws, LegacyStateDir, NativeTurnFile)
		if err := os.MkdirAll(filepath.Dir(legacy), 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(legacy, []byte("7\n"), 0o600); err != nil {
			return err
		}
		moved, err := AdoptLegacyState(ws, state)
		if err == nil && !moved {
			err = errors.New("nothing was adopted")
		}
		return err
	})
}
