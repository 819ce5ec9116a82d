// Package docs holds the project's documents; its code checks that they
// keep their promises: docs/rules.md has a row for every rule and every test
// it names really exists (whether they pass is the suite's business), and
// protocol.md's walkthrough is what a real server answers.
package docs

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// packageDirs maps the short package names rules.md uses to directories.
var packageDirs = map[string]string{
	"runnerd":      "cmd/runnerd",
	"supervisor":   "sandbox/supervisor",
	"docker":       "sandbox/docker",
	"process":      "sandbox/process",
	"turn":         "runner/turn",
	"sqlstore":     "controlplane/store/sqlstore",
	"memnet":       "internal/memnet",
	"demoagent":    "cmd/demoagent",
	"sandbox":      "sandbox",
	"controlplane": "controlplane",
	// cmd/controlplane is package main; "controlplane" is the server's.
	"controlplanecmd": "cmd/controlplane",
	"model":           "integration/model",
	"checker":         "integration/chaos/checker",
	"boottime":        "internal/boottime",
	"sdscope":         "internal/sdscope",
}

func ruleIDs() []string {
	var ids []string
	for i := 1; i <= 37; i++ {
		ids = append(ids, fmt.Sprintf("R%d", i))
	}
	for i := 1; i <= 8; i++ {
		ids = append(ids, fmt.Sprintf("P%d", i))
	}
	for i := 1; i <= 13; i++ {
		ids = append(ids, fmt.Sprintf("K%d", i))
	}
	for i := 1; i <= 6; i++ {
		ids = append(ids, fmt.Sprintf("A%d", i))
	}
	for i := 1; i <= 7; i++ {
		ids = append(ids, fmt.Sprintf("S%d", i))
	}
	return ids
}

var rowRE = regexp.MustCompile(`^\| ([RPKAS]\d+) \| (.+) \|$`)

// unproven starts a row that says why a rule has no proving test yet.
const unproven = "not proven yet:"

func TestRulesTableNamesRealTests(t *testing.T) {
	f, err := os.Open("rules.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows := map[string][]string{}
	gaps := map[string]bool{} // rules whose row says they are not proven yet
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m := rowRE.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		if _, dup := rows[m[1]]; dup {
			t.Errorf("rule %s has two rows", m[1])
		}
		if strings.HasPrefix(m[2], unproven) {
			t.Logf("rule %s is not done: %s", m[1], m[2])
			rows[m[1]] = nil
			gaps[m[1]] = true
			continue
		}
		for _, name := range strings.Split(m[2], ",") {
			rows[m[1]] = append(rows[m[1]], strings.TrimSpace(name))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	for _, id := range ruleIDs() {
		if len(rows[id]) == 0 && !gaps[id] {
			t.Errorf("rule %s has no row naming a proving test", id)
		}
	}
	src := map[string]string{} // directory → its test sources
	for id, names := range rows {
		for _, name := range names {
			if err := checkTest(name, src); err != nil {
				t.Errorf("%s: %s: %v", id, name, err)
			}
		}
	}
}

// checkTest finds pkg.TestFunc[/subtest…] in the package's test files.
func checkTest(name string, src map[string]string) error {
	pkg, rest, ok := strings.Cut(name, ".")
	if !ok {
		return fmt.Errorf("not package.TestName")
	}
	dir := pkg
	if d, ok := packageDirs[pkg]; ok {
		dir = d
	}
	fn, sub, _ := strings.Cut(rest, "/")
	fns := []string{fn}
	if fn == "Test*Conformance" {
		fns = []string{"TestSQLiteConformance", "TestPostgresConformance"}
	}
	text, err := testSources(filepath.Join("..", dir), src)
	if err != nil {
		return err
	}
	for _, fn := range fns {
		if !regexp.MustCompile(`(?m)^func ` + regexp.QuoteMeta(fn) + `\(`).MatchString(text) {
			return fmt.Errorf("no func %s in %s", fn, dir)
		}
	}
	if sub == "" {
		return nil
	}
	if pkg == "sqlstore" { // the conformance suite lives beside the store
		if text, err = testSources(filepath.Join("..", "controlplane/store/storetest"), src); err != nil {
			return err
		}
	}
	for _, part := range strings.Split(sub, "/") {
		if !strings.Contains(text, `"`+part) && !strings.Contains(text, `"`+strings.ReplaceAll(part, "_", " ")) {
			return fmt.Errorf("no subtest %q in %s", part, dir)
		}
	}
	return nil
}

// testSources is the text of a directory's Go files (the conformance suite
// is an ordinary file, so every .go file counts), read once.
func testSources(dir string, cache map[string]string) (string, error) {
	if s, ok := cache[dir]; ok {
		return s, nil
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(files) == 0 {
		return "", fmt.Errorf("no Go files in %s", dir)
	}
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		b.Write(data)
		b.WriteByte('\n')
	}
	cache[dir] = b.String()
	return cache[dir], nil
}
