package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestQuickRun runs `make bench`'s command in its quickest mode against
// binaries built from this tree, so that it cannot rot: every benchmark
// runs (PostgreSQL too when RUNNERD_TEST_POSTGRES is set), and the JSON
// and the generated section of the document hold one row per figure.
// Nothing here judges a figure.
func TestQuickRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries and runs real daemons")
	}
	dir := t.TempDir()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	// The build and the run each have a bound of their own, generous ones:
	// they only catch a hang. On a fresh machine the build starts from a
	// cold cache beside every other package's tests, and one shared bound
	// let a slow build starve the run (or end the build itself).
	bctx, bcancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer bcancel()
	bin := filepath.Join(dir, "bin")
	build := exec.CommandContext(bctx, "go", "build", "-trimpath", "-o", bin+"/", "./cmd/runnerd", "./cmd/runnerd-child", "./cmd/controlplane", "./cmd/demoagent")
	build.Dir, build.Env = root, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	doc := filepath.Join(dir, "performance.md")
	if err := os.WriteFile(doc, []byte("# Performance\n\nbefore\n\n"+beginMarker+"\nold figures\n"+endMarker+"\n\nafter\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	js := filepath.Join(dir, "bench.json")
	var stdout, stderr bytes.Buffer
	// River's bench module (its own go.mod) is built and run beside B2
	// when PostgreSQL is there, so that it cannot rot either.
	code := run(ctx, []string{"-quick", "-bin", bin, "-doc", doc, "-json", js, "-river", filepath.Join(root, "tools", "riverbench")}, os.Getenv, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("bench -quick = %d\n%s", code, stderr.String())
	}

	var rep report
	raw, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	stores := 1
	if os.Getenv("RUNNERD_TEST_POSTGRES") != "" {
		stores = 2
	}
	// Rows per benchmark: B1 three per store, B2 two per store (claim →
	// finish, token lookups), one of SQLite's group commit and, on
	// PostgreSQL, WAL per turn, River, the whole protocol turn and its WAL,
	// three of round trips and four ratios to River (SQLite's claim →
	// finish, PostgreSQL's, the whole turn, the WAL), B3 one
	// (SQLite), B4 two per backend (SQLite; the Docker pair when an engine
	// answers), B5 two, B6 two per store.
	backends := 1
	if dockerAnswers(ctx) {
		backends = 2
	}
	want := map[string]int{"B1": 3 * stores, "B2": 2*stores + 1 + (4+3+4)*(stores-1), "B3": 1, "B4": 2 * backends, "B5": 2, "B6": 2 * stores}
	got := map[string]int{}
	for _, r := range rep.Rows {
		got[r.ID]++
		if r.NotRun == "" && (r.Value < 0 || r.Unit == "") {
			t.Errorf("row %+v has no figure and does not say why", r)
		}
		if r.NotRun != "" && r.Value != 0 {
			t.Errorf("row %+v is not run but has a figure", r)
		}
	}
	if stores == 2 {
		river := 0
		for _, r := range rep.Rows {
			if strings.HasPrefix(r.What, "River v") && r.Store == postgres && r.Unit == "jobs/s" && r.Value > 0 && r.NotRun == "" {
				river++
			}
		}
		if river != 1 {
			t.Errorf("%d rows of River's jobs/s on PostgreSQL, want 1 (%v)", river, rep.Rows)
		}
	}
	for id, n := range want {
		if got[id] != n {
			t.Errorf("%s: %d rows, want %d (%v)", id, got[id], n, rep.Rows)
		}
	}
	if rep.Machine.Cores < 1 || rep.Go == "" || rep.Date == "" || !rep.Settings.Quick {
		t.Errorf("report header = %+v", rep)
	}

	text, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	s := string(text)
	if strings.Contains(s, "old figures") || !strings.HasPrefix(s, "# Performance\n\nbefore\n\n"+beginMarker+"\n") || !strings.HasSuffix(s, endMarker+"\n\nafter\n") {
		t.Errorf("generated section not replaced in place:\n%s", s)
	}
	if !strings.Contains(s, "| B2 | HTTP claim → finish, 4 hosts × 4 slots | sqlite | **") {
		t.Errorf("document lacks the B2 row:\n%s", s)
	}
}

// TestSpliceAppendsOrRefuses: a document without the markers gets the
// section at its end; markers out of order are an error, not a guess.
func TestSpliceAppendsOrRefuses(t *testing.T) {
	dir := t.TempDir()
	r := &report{Rows: []row{{ID: "B5", What: "x", NotRun: "because"}}}
	p := filepath.Join(dir, "a.md")
	if err := os.WriteFile(p, []byte("# Doc\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.splice(p); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	if !strings.HasPrefix(string(b), "# Doc\n\n"+beginMarker+"\n") || !strings.Contains(string(b), "not run: because") {
		t.Errorf("appended section:\n%s", b)
	}
	if err := os.WriteFile(p, []byte(endMarker+"\n"+beginMarker+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.splice(p); err == nil {
		t.Error("splice accepted markers out of order")
	}
}
