package process

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/runnerd/runnerd/internal/atomicfile/stracetest"
	"github.com/runnerd/runnerd/sandbox"
)

// TestS7SandboxFilesAreDurable: under strace (following the supervisor the
// backend starts), making a conversation's sandbox over a workspace the
// previous release served — its id, the native turn adopted from the
// workspace, the supervisor's pid and the supervisor's own state files —
// and activating it write each file to a temporary file, sync it, rename
// it and sync its directory before going on.
func TestS7SandboxFilesAreDurable(t *testing.T) {
	check := stracetest.Check{Exempt: []string{"supervisor.log.1"}} // the last supervisor's log, moved aside
	check.Durable(t, func(dir string) error {
		b := newBackend(t, dir)
		legacy := filepath.Join(b.Workspace("conv-a"), sandbox.LegacyStateDir)
		if err := os.MkdirAll(legacy, 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(legacy, sandbox.NativeTurnFile), []byte("4\n"), 0o600); err != nil {
			return err
		}
		ctx := context.Background()
		sp := spec("conv-a")
		sp.Cluster = "cluster_s7" // recorded with the new sandbox (K8 per sandbox)
		sb, err := b.Ensure(ctx, sp)
		if err != nil {
			return err
		}
		act, err := sb.Client().Activate(ctx, 0)
		if err == nil && act.NativeTurn != 4 {
			err = errors.New("the supervisor did not start at the adopted native turn")
		}
		return errors.Join(err, b.Remove(ctx, "conv-a"))
	})
}
