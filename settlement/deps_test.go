package settlement_test

import (
	"go/parser"
	gotoken "go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestImportsPointOneWay: settlement imports only diagnostics and wire of
// this module — never sandbox, heartbeat, handover or runner; the prompt
// and the supervisor settlement reach it as functions.
func TestImportsPointOneWay(t *testing.T) {
	const mod = "github.com/runnerd/runnerd/"
	allowed := []string{mod + "diagnostics", mod + "wire"}
	files, _ := filepath.Glob("*.go")
	if len(files) < 2 {
		t.Fatalf("no Go files")
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(gotoken.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if strings.HasPrefix(p, mod) && !slices.Contains(allowed, p) {
				t.Errorf("%s imports %s", f, p)
			}
		}
	}
}
