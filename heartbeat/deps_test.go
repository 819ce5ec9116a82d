package heartbeat_test

import (
	"go/parser"
	gotoken "go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Dependencies point one way: heartbeat imports only diagnostics and wire
// of this module, and diagnostics only wire (never heartbeat).
func TestImportsPointOneWay(t *testing.T) {
	const mod = "github.com/runnerd/runnerd/"
	for dir, allowed := range map[string][]string{
		".":              {mod + "diagnostics", mod + "wire"},
		"../diagnostics": {mod + "wire"},
	} {
		files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		if len(files) < 2 {
			t.Fatalf("no Go files in %s", dir)
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
}
