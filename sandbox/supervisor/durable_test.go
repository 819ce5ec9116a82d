package supervisor

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/runnerd/runnerd/internal/atomicfile/stracetest"
	"github.com/runnerd/runnerd/sandbox"
)

// TestS7StateFilesAreDurable: under strace, a supervisor that starts on a
// new state directory (the state version and the native turn written) and
// is activated (the activation's retained record, K13, on disk before its
// token is handed out) writes each of its state files to a temporary file,
// syncs it, renames it and syncs the state directory before it goes on.
func TestS7StateFilesAreDurable(t *testing.T) {
	stracetest.Durable(t, func(dir string) error {
		state := filepath.Join(dir, "state")
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		activated := make(chan error, 1)
		cfg := Config{
			Socket:    filepath.Join(dir, "s.sock"),
			Workspace: filepath.Join(dir, "ws"),
			StateDir:  state,
			Ready: func() {
				go func() {
					_, err := (&sandbox.Client{Socket: filepath.Join(dir, "s.sock")}).Activate(ctx, 0)
					activated <- err
					cancel()
				}()
			},
		}
		err := Serve(ctx, cfg)
		if aerr := <-activated; aerr != nil {
			return errors.Join(err, aerr)
		}
		if err != nil {
			return err
		}
		for _, name := range []string{sandbox.StateVersionFile, nativeTurnFile, sandbox.RetainedFile} {
			if _, err := os.Stat(filepath.Join(state, name)); err != nil {
				return err
			}
		}
		return nil
	})
}
