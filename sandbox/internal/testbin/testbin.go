// Package testbin builds the binaries the sandbox tests run as real
// processes (the demo agent) and waits on real processes without sleeping.
// Only tests of the sandbox packages import it.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runnerd/runnerd/sandbox/internal/pidfd"
)

// BuildDemoAgent builds cmd/demoagent, static, into dir and returns its path.
// Call it from TestMain: the build cache makes repeated builds cheap.
func BuildDemoAgent(dir string) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out := filepath.Join(dir, "demoagent")
	cmd := exec.Command(goBin, "build", "-trimpath", "-o", out, "github.com/runnerd/runnerd/cmd/demoagent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build demoagent: %w\n%s", err, b)
	}
	return out, nil
}

// binDir is Main's directory of built binaries, removed when the tests end.
var binDir string

var exampleAgent struct {
	once sync.Once
	path string
	err  error
}

// ExampleAgent builds, once per test binary, the ACP SDK's own example
// agent (github.com/coder/acp-go-sdk/example/agent, from the module
// cache): an ACP agent this project did not write. Only under Main.
func ExampleAgent(t testing.TB) string {
	t.Helper()
	exampleAgent.once.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		out := filepath.Join(binDir, "acp-example-agent")
		cmd := exec.Command(goBin, "build", "-trimpath", "-o", out, "github.com/coder/acp-go-sdk/example/agent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			exampleAgent.err = fmt.Errorf("build the ACP example agent: %w\n%s", err, b)
			return
		}
		exampleAgent.path = out
	})
	if exampleAgent.err != nil {
		t.Fatal(exampleAgent.err)
	}
	return exampleAgent.path
}

// WaitGone waits, on a pidfd and not by polling, until process pid has
// exited (a zombie counts as exited), or the timeout passes.
func WaitGone(pid int, timeout time.Duration) error { return pidfd.WaitExit(pid, timeout) }

// Main is the TestMain of a sandbox test package. When the test binary is
// re-entered with a first argument naming one of roles (as runnerd is with
// "supervise"), it runs that role with the remaining arguments and exits
// with its status. Otherwise it builds the demo agent into *demoAgent, runs
// the tests and checks that no goroutine leaked.
func Main(m *testing.M, demoAgent *string, roles map[string]func(args []string) int) {
	if len(os.Args) > 1 {
		if role, ok := roles[os.Args[1]]; ok {
			os.Exit(role(os.Args[2:]))
		}
	}
	dir, err := os.MkdirTemp("", "sandbox-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	*demoAgent, err = BuildDemoAgent(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Alive reports whether pid names a process that has not exited. A zombie
// is not alive.
func Alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// State is the field after the parenthesised command name.
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == ')' && i+2 < len(b) {
			return b[i+2] != 'Z' && b[i+2] != 'X'
		}
	}
	return false
}
