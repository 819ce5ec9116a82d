package sqlstore

import (
	"embed"
	"strings"
)

// The fenced statements of the worker's operations, one per operation and
// dialect, in sql/<dialect>/<operation>.sql; sql/guard.sql is the fence
// they share, which each names as /* guard.sql */ where it stands.
//
//go:embed sql
var statementFiles embed.FS

// statement is the operation's statement in dialect d with the fence in
// place. fenceOpen and fenceClose, empty but in the chaos campaign's
// deliberately broken build (fence_broken.go), wrap the fence.
func statement(d dialect, op string) string {
	dir := "sql/sqlite/"
	if d == postgres {
		dir = "sql/postgres/"
	}
	return strings.ReplaceAll(readStatement(dir+op+".sql"), "/* guard.sql */", fenceOpen+"("+readStatement("sql/guard.sql")+")"+fenceClose)
}

func readStatement(name string) string {
	b, err := statementFiles.ReadFile(name)
	if err != nil {
		panic("sqlstore: " + err.Error()) // embedded: missing only in a broken build
	}
	return string(b)
}
