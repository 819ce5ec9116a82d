package docker_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/docker/docker/api/types/container"

	"github.com/runnerd/runnerd/internal/atomicfile/stracetest"
	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/docker"
)

// TestS7DockerAdoptedNativeTurnIsDurable: under strace, the backend making a
// container anew over a workspace volume the previous release served moves
// that release's native turn into the conversation's state directory on
// the host, written to a temporary file, synced, renamed and the directory
// synced before the container is created; the new supervisor starts at
// it. (The supervisor's own writes, in the container, are proven by
// supervisor.TestS7StateFilesAreDurable.)
func TestS7DockerAdoptedNativeTurnIsDurable(t *testing.T) {
	if env.skip != "" {
		t.Skip(env.skip)
	}
	// The link to the supervisor's socket is made anew at each start.
	check := stracetest.Check{Exempt: []string{"supervisor.sock"}}
	check.Durable(t, func(dir string) error {
		b, cfg, ctx, spec, sb := ensured(t, func(c *docker.Config) { c.StateDir = dir })
		info, err := env.engine.ContainerInspect(ctx, sb.ID)
		if err != nil {
			return err
		}
		var vol string
		for _, m := range info.Mounts {
			if m.Destination == docker.DefaultWorkspace {
				vol = m.Name
			}
		}
		v, err := env.engine.VolumeInspect(ctx, vol)
		if err != nil {
			return err
		}
		if err := env.engine.ContainerRemove(ctx, sb.ID, container.RemoveOptions{Force: true}); err != nil {
			return err
		}
		legacy := filepath.Join(v.Mountpoint, sandbox.LegacyStateDir, sandbox.NativeTurnFile)
		if err := os.MkdirAll(filepath.Dir(legacy), 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(legacy, []byte("5\n"), 0o600); err != nil {
			return err
		}
		if err := os.RemoveAll(hostStateDir(t, cfg)); err != nil {
			return err
		}
		sb2, err := b.Ensure(ctx, spec)
		if err != nil {
			return err
		}
		st, err := sb2.Client().Status(ctx)
		if err == nil && st.NativeTurn != 5 {
			err = fmt.Errorf("the new supervisor starts at native turn %d, want the adopted 5", st.NativeTurn)
		}
		return errors.Join(err, b.Remove(ctx, spec.ConversationID))
	})
}
