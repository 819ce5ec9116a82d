package runner_test

import (
	"go/parser"
	gotoken "go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// moduleImports is the one statement of which package of the module may
// import which (style 2): cmd → runner → {heartbeat, handover, sandbox,
// settlement} → {diagnostics, wire}; the control plane imports only wire and
// its store; siblings never import each other. A directory matches its
// longest listed prefix; nil means "anything" (commands and the end-to-end
// harness). A package that matches no entry fails the test, so a new one
// must take its place here.
var moduleImports = map[string][]string{
	"cmd":         nil,
	"integration": nil,

	"runner": {"diagnostics", "handover", "heartbeat", "internal/atomicfile", "internal/boottime", "internal/failover", "internal/retry", "internal/tlsfiles", "internal/workerbatch", "runner/turn", "sandbox", "settlement", "wire"},
	// Not sandbox/docker: the process backend's lean child (cmd/runnerd-child) runs turn.
	"runner/turn": {"diagnostics", "handover", "internal/boottime", "internal/failover", "internal/retry", "internal/tlsfiles", "sandbox", "sandbox/process", "settlement", "wire"},

	"heartbeat":  {"diagnostics", "internal/boottime", "wire"},
	"handover":   {"internal/boottime"},
	"settlement": {"diagnostics", "internal/retry", "wire"},

	"sandbox":                  {"internal/atomicfile", "internal/boottime", "wire"},
	"sandbox/docker":           {"sandbox"},
	"sandbox/process":          {"internal/atomicfile", "sandbox", "sandbox/internal/pidfd"},
	"sandbox/supervisor":       {"internal/atomicfile", "internal/boottime", "sandbox", "sandbox/internal/pidfd", "wire"},
	"sandbox/internal/pidfd":   {},
	"sandbox/internal/testbin": {"sandbox/internal/pidfd"},

	"diagnostics": {"wire"},
	"wire":        {},

	"controlplane":                        {"controlplane/store", "wire"},
	"controlplane/store":                  {"controlplane/store", "wire"},  // and the stores below it
	"controlplane/store/sqlstore/sqltest": {"controlplane/store/sqlstore"}, // tests only: both stores behind one helper

	"internal/atomicfile":            {},                      // durable replacement by rename, a leaf anything may import
	"internal/atomicfile/stracetest": {"internal/atomicfile"}, // tests only

	"internal/boottime":         {},       // CLOCK_BOOTTIME, a leaf anything may import
	"internal/failover":         {},       // several control-plane addresses: the daemon's and the turn child's transports
	"internal/fleet":            {"wire"}, // the process harness of integration and cmd/demo
	"internal/memnet":           {},
	"internal/retry":            {"wire"},
	"internal/sdscope":          {},       // systemd scopes: cmd/runnerd alone imports it
	"internal/syncbuf":          {},       // tests only
	"internal/tlsfiles":         {},       // the TLS flags' PEM files: the daemon, the turn child, the control plane's commands
	"internal/tlsfiles/tlstest": {},       // tests only: certificates made in the test
	"internal/tools":            {},       // pins go.mod's requirements (build tag tools)
	"internal/workerbatch":      {"wire"}, // the daemon's per-host batching of attempt-scoped calls

	"internal/bench/held":     {"internal/fleet", "wire"}, // a whole host's cost per held turn
	"internal/bench/held/cmd": nil,                        // its command
}

// TestImportsPointOneWay reads the imports of every non-test file of the
// module and checks them against moduleImports.
func TestImportsPointOneWay(t *testing.T) {
	const mod = "github.com/runnerd/runnerd/"
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); p != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "bin") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(p, "go.mod")); p != root && err == nil {
				return filepath.SkipDir // a module of its own (tools/packages): not the product's
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, filepath.Dir(p))
		pkg := filepath.ToSlash(rel)
		allowed, ok := allowedImports(pkg)
		if !ok {
			t.Errorf("package %s has no entry in moduleImports: place it in the dependency line", pkg)
			return nil
		}
		af, err := parser.ParseFile(gotoken.NewFileSet(), p, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		checked++
		for _, imp := range af.Imports {
			ip, _ := strconv.Unquote(imp.Path.Value)
			dep, inModule := strings.CutPrefix(ip, mod)
			if inModule && allowed != nil && !slices.Contains(allowed, dep) {
				t.Errorf("%s imports %s", filepath.Join(rel, filepath.Base(p)), dep)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("only %d files checked: is the walk rooted at the module?", checked)
	}
}

// allowedImports finds pkg's longest listed prefix.
func allowedImports(pkg string) ([]string, bool) {
	for p := pkg; p != "." && p != "/"; p = path.Dir(p) {
		if allowed, ok := moduleImports[p]; ok {
			return allowed, true
		}
	}
	return nil, false
}

// The checker itself: a sibling import is refused, a listed one allowed,
// and a new package must be placed.
func TestAllowedImports(t *testing.T) {
	tests := []struct {
		name    string
		pkg     string
		dep     string
		allowed bool
		known   bool
	}{
		{"runner uses heartbeat", "runner", "heartbeat", true, true},
		{"heartbeat may not use settlement", "heartbeat", "settlement", false, true},
		{"settlement may not use sandbox", "settlement", "sandbox", false, true},
		{"controlplane may not use diagnostics", "controlplane", "diagnostics", false, true},
		{"a store below controlplane/store uses the interface", "controlplane/store/sqlstore", "controlplane/store", true, true},
		{"commands use anything", "cmd/runnerd", "sandbox/supervisor", true, true},
		{"an unplaced package is refused", "newpkg", "wire", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			allowed, known := allowedImports(tt.pkg)
			got := known && (allowed == nil || slices.Contains(allowed, tt.dep))
			if known != tt.known || got != tt.allowed {
				t.Fatalf("%s → %s: known %v allowed %v, want %v %v", tt.pkg, tt.dep, known, got, tt.known, tt.allowed)
			}
		})
	}
}
