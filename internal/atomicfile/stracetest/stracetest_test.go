package stracetest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runnerd/runnerd/internal/atomicfile"
)

// handWritten replaces dir/record the way the helpers atomicfile replaced
// did, each with its own omission.
func handWritten(syncFile, syncDir bool, prefix string) func(dir string) error {
	return func(dir string) error {
		f, err := os.CreateTemp(dir, prefix+"record-*")
		if err != nil {
			return err
		}
		if _, err := f.WriteString("data\n"); err != nil {
			return err
		}
		if syncFile {
			if err := f.Sync(); err != nil {
				return err
			}
		}
		if err := f.Close(); err != nil {
			return err
		}
		if err := os.Rename(f.Name(), filepath.Join(dir, "record")); err != nil {
			return err
		}
		if !syncDir {
			return nil
		}
		d, err := os.Open(dir)
		if err != nil {
			return err
		}
		defer d.Close()
		return d.Sync()
	}
}

// TestCheckerCatchesUndurableWriters: the check fails a writer that does
// not sync its directory after the rename, one that does not sync the file
// before it, one whose temporary file is not named as atomicfile names
// them, and one that renames nothing; and passes atomicfile.Write and the
// hand-written equivalent.
func TestCheckerCatchesUndurableWriters(t *testing.T) {
	tests := []struct {
		name  string
		write func(dir string) error
		want  string // in a problem; "" for none
	}{
		{"no_directory_sync", handWritten(true, false, atomicfile.TempPrefix), "was not synced after the rename"},
		{"no_file_sync", handWritten(false, true, atomicfile.TempPrefix), "was not synced after its last write"},
		{"foreign_temporary_name", handWritten(true, true, "record.tmp."), "temporary file of atomicfile's naming"},
		{"nothing_renamed", func(dir string) error { return os.WriteFile(filepath.Join(dir, "record"), nil, 0o600) }, "nothing was renamed under"},
		{"hand_written_durable", handWritten(true, true, atomicfile.TempPrefix), ""},
		{"atomicfile", func(dir string) error { return atomicfile.Write(filepath.Join(dir, "record"), []byte("x"), 0o600) }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			problems := Check{}.durable(t, []func(string) error{tt.write})
			if _, child := os.LookupEnv(envDir); child {
				return
			}
			got := strings.Join(problems, "\n")
			if tt.want == "" && got != "" || !strings.Contains(got, tt.want) {
				t.Fatalf("problems:\n%s\nwant one with %q", got, tt.want)
			}
		})
	}
}

// TestParseJoinsInterleavedCalls: a call strace split across lines,
// another thread's call in between, is read as one, ending where it
// resumed.
func TestParseJoinsInterleavedCalls(t *testing.T) {
	trace := strings.Join([]string{
		`10 fsync(5</d/.tmp-record-1> <unfinished ...>`,
		`11 write(2<pipe:[7]>, "x", 1) = 1`,
		`10 <... fsync resumed>) = 0`,
		`10 renameat(AT_FDCWD</>, "/d/.tmp-record-1", AT_FDCWD</d>, "record") = 0`,
		`10 +++ exited with 0 +++`,
	}, "\n")
	calls := parse(t, trace)
	if len(calls) != 3 {
		t.Fatalf("parsed %d calls, want 3: %+v", len(calls), calls)
	}
	c := calls[0]
	if c.name != "fsync" || c.start != 0 || c.end != 2 || !ok(c) || fdPath(c) != "/d/.tmp-record-1" {
		t.Fatalf("the split fsync read as %+v", c)
	}
	if old, target := renamePaths(calls[2]); old != "/d/.tmp-record-1" || target != "/d/record" {
		t.Fatalf("rename paths %q %q", old, target)
	}
}
