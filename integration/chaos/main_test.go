package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/runnerd/runnerd/internal/fleet"
)

// bins are the binaries TestMain built; skewcp is the replica with a
// skewed clock. Empty when the campaign cannot run here (absent says why).
var (
	bins   fleet.Binaries
	skewcp string
	absent string
)

func TestMain(m *testing.M) {
	os.Exit(buildAndRun(m))
}

// need says what this machine lacks for the campaign: root (namespaces,
// veth pairs), ip, PostgreSQL's server binaries; "" when nothing.
func need() string {
	if os.Geteuid() != 0 {
		return "the chaos campaign needs root (network namespaces, veth pairs, a PostgreSQL cluster of its own)"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "the chaos campaign needs ip (iproute2)"
	}
	if _, err := pgBinDir(); err != nil {
		return "the chaos campaign needs PostgreSQL's server binaries: " + err.Error()
	}
	return ""
}

func buildAndRun(m *testing.M) int {
	// toxiproxy's toxics log through zerolog's global logger.
	zerolog.SetGlobalLevel(zerolog.Disabled)
	if absent = need(); absent != "" {
		return m.Run() // the test skips, or fails under RUNNERD_REQUIRE_DOCKER=1
	}
	dir, err := os.MkdirTemp("", "runnerd-chaos-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	// Readable by the containers' bind mount and by every namespace.
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	root, err := moduleRoot()
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		bins, err = fleet.Build(ctx, root, dir)
		if err == nil {
			skewcp = filepath.Join(dir, "skewcp")
			cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", skewcp, "./integration/chaos/skewcp")
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, berr := cmd.CombinedOutput(); berr != nil {
				err = fmt.Errorf("go build skewcp: %w\n%s", berr, out)
			}
		}
		cancel()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos: build the binaries:", err)
		return 1
	}
	return m.Run()
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the module")
	}
	return filepath.Dir(mod), nil
}

// requireFleet skips (or, where CI requires Docker, fails) when the
// campaign cannot run on this machine.
func requireFleet(t *testing.T) {
	t.Helper()
	if absent == "" {
		return
	}
	if os.Getenv("RUNNERD_REQUIRE_DOCKER") == "1" {
		t.Fatalf("RUNNERD_REQUIRE_DOCKER=1 but %s", absent)
	}
	t.Skipf("%s; set RUNNERD_REQUIRE_DOCKER=1 to make this a failure", absent)
}
