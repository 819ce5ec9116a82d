package sandbox

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/runnerd/runnerd/internal/atomicfile"
)

// NativeTurnFile is the file, in the supervisor's state directory, that
// holds the native turn ordinal: the boundary R31 verifies.
const NativeTurnFile = "native_turn"

// LegacyStateDir is where the previous release kept the supervisor's state:
// inside the workspace, where the agent can overwrite it.
const LegacyStateDir = ".runnerd"

// AdoptLegacyState moves the native turn ordinal a supervisor of the
// previous release kept in workspace/.runnerd into stateDir, once: if
// stateDir has one already, nothing changes. A backend calls it before it
// starts a supervisor over stateDir for a workspace an older release may
// have served. It reports whether it moved anything. Only a regular file
// holding one number, in a real directory, is taken; anything else there
// is an error, as a corrupt state file is to the supervisor (the sandbox is
// not used until an operator looks). The legacy file is then removed (best
// effort: what is left there is never read again).
func AdoptLegacyState(workspace, stateDir string) (bool, error) {
	target := filepath.Join(stateDir, NativeTurnFile)
	if _, err := os.Lstat(target); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	// The agent could write both components: follow no symlink (a backend
	// may read a container's workspace from the host).
	di, err := os.Lstat(filepath.Join(workspace, LegacyStateDir))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("adopt legacy state: %w", err)
	case !di.IsDir():
		return false, fmt.Errorf("adopt legacy state: %s is not a directory", LegacyStateDir)
	}
	legacy := filepath.Join(workspace, LegacyStateDir, NativeTurnFile)
	fi, err := os.Lstat(legacy)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("adopt legacy state: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return false, fmt.Errorf("adopt legacy state: %s is not a regular file", legacy)
	}
	f, err := os.Open(legacy)
	if err != nil {
		return false, fmt.Errorf("adopt legacy state: %w", err)
	}
	b, err := io.ReadAll(io.LimitReader(f, 64))
	f.Close()
	if err != nil {
		return false, fmt.Errorf("adopt legacy state: %w", err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n < 0 {
		return false, fmt.Errorf("adopt legacy state: %s does not hold a native turn", legacy)
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return false, fmt.Errorf("adopt legacy state: %w", err)
	}
	if err := atomicfile.Write(target, fmt.Appendf(nil, "%d\n", n), 0o600); err != nil {
		return false, fmt.Errorf("adopt legacy state: %w", err)
	}
	_ = os.Remove(legacy)
	_ = os.Remove(filepath.Dir(legacy)) // only if empty
	return true, nil
}
