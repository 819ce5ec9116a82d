package atomicfile_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/runnerd/runnerd/internal/atomicfile"
	"github.com/runnerd/runnerd/internal/atomicfile/stracetest"
)

// TestWriteReplacesWithTheModeAsked: a new file and a replaced one hold
// what was written last, with the mode asked for whatever the umask, and
// nothing else is left in the directory.
func TestWriteReplacesWithTheModeAsked(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	for _, step := range []struct {
		data string
		perm fs.FileMode
	}{{"first", 0o600}, {"second", 0o644}, {"third", 0o600}} {
		if err := atomicfile.Write(path, []byte(step.data), step.perm); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != step.data || fi.Mode().Perm() != step.perm {
			t.Fatalf("after writing %q %v: %q %v", step.data, step.perm, b, fi.Mode().Perm())
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 {
		t.Fatalf("the directory holds %d files, want only state.json", len(ents))
	}
}

// TestWriteFailureReturnsItsErrorAndLeavesNothing: a rename that fails (a
// directory stands at the path) and a temporary file that cannot be made
// (no directory) are returned as errors; the failed write leaves no
// temporary file and the directory at the path untouched.
func TestWriteFailureReturnsItsErrorAndLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "taken")
	if err := os.MkdirAll(filepath.Join(path, "inside"), 0o700); err != nil {
		t.Fatal(err)
	}
	err := atomicfile.Write(path, []byte("x"), 0o600)
	if err == nil || !strings.Contains(err.Error(), "rename") {
		t.Fatalf("Write over a directory: %v, want the rename's error", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 || ents[0].Name() != "taken" || !ents[0].IsDir() {
		t.Fatalf("after the failed write the directory holds %v", ents)
	}
	if err := atomicfile.Write(filepath.Join(dir, "missing", "f"), []byte("x"), 0o600); err == nil {
		t.Fatal("Write into a missing directory succeeded")
	}
}

// TestS7WriteSyncsFileRenameAndDirectory: under strace, a new file and a
// replaced one are each written, synced, renamed and their directory
// synced before Write returns.
func TestS7WriteSyncsFileRenameAndDirectory(t *testing.T) {
	write := func(dir string) error {
		return atomicfile.Write(filepath.Join(dir, "record"), []byte("data\n"), 0o600)
	}
	stracetest.Durable(t, write, write)
}

// TestS7CrashLeavesARecognisedLeftover: a write killed at its rename
// leaves the old file intact and a temporary file RemoveLeftovers knows
// as one and removes, and nothing else.
func TestS7CrashLeavesARecognisedLeftover(t *testing.T) {
	dir := stracetest.Crash(t, func(dir string) {
		if err := atomicfile.Write(filepath.Join(dir, "record"), []byte("old\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "tmp-not-ours"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}, func(dir string) error {
		return atomicfile.Write(filepath.Join(dir, "record"), []byte("new\n"), 0o600)
	})
	left, err := filepath.Glob(filepath.Join(dir, atomicfile.TempPrefix+"record-*"))
	if err != nil || len(left) != 1 {
		t.Fatalf("the crashed write left %v (%v), want one temporary file", left, err)
	}
	if err := atomicfile.RemoveLeftovers(dir); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "record tmp-not-ours" {
		t.Fatalf("after RemoveLeftovers the directory holds %v", names)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "record")); string(b) != "old\n" {
		t.Fatalf("the crashed write changed the file: %q", b)
	}
}
