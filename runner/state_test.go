package runner

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/runnerd/runnerd/internal/atomicfile"
	"github.com/runnerd/runnerd/settlement"
	"github.com/runnerd/runnerd/wire"
)

func testRecord(id string) record {
	return record{
		Claim:     wire.Claim{JobID: "job-" + id, AttemptID: id, LeaseGeneration: 3, WorkerToken: "wtok-secret", LeaseTTLMS: 1200},
		ClaimedAt: time.Now(),
	}
}

// A persisted attempt holds its worker token: the file is 0600 in a 0700
// directory, and it reads back as written.
func TestStateFilesArePrivate(t *testing.T) {
	root := t.TempDir()
	s, err := openStateDir(root)
	if err != nil {
		t.Fatal(err)
	}
	want := testRecord("att-1")
	want.Report = &settlement.Report{Finish: &wire.FinishRequest{AttemptRef: wire.AttemptRef{AttemptID: "att-1", LeaseGeneration: 3}, Outcome: wire.OutcomeFailed}}
	if err := s.save(want); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(s.path("att-1"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("state file mode %v, want 0600", fi.Mode().Perm())
	}
	di, err := os.Stat(filepath.Join(root, "attempts"))
	if err != nil {
		t.Fatal(err)
	}
	if di.Mode().Perm() != 0o700 {
		t.Fatalf("state directory mode %v, want 0700", di.Mode().Perm())
	}
	got, bad := s.load()
	if len(bad) != 0 || len(got) != 1 || !reflect.DeepEqual(got[0].Claim, want.Claim) || got[0].Report == nil || *got[0].Report.Finish != *want.Report.Finish {
		t.Fatalf("load = %+v, bad %v", got, bad)
	}
	if err := s.remove("att-1"); err != nil {
		t.Fatal(err)
	}
	if s.exists("att-1") {
		t.Fatal("attempt still persisted after remove")
	}
	if err := s.remove("att-1"); err != nil {
		t.Fatalf("second remove: %v", err)
	}
}

// Writes are atomic: a crash mid-write leaves a temporary file and the old
// record intact. The temporary file is swept at start, and so is a
// re-attach socket without a record (a child started before the flush); a
// corrupt record is moved aside and the others still load.
func TestStateSurvivesCrashLeftovers(t *testing.T) {
	root := t.TempDir()
	s, err := openStateDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"att-a", "att-b"} {
		if err := s.save(testRecord(id)); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(root, "attempts")
	// Writes of att-a cut short: half a record in a temporary file, named
	// as atomicfile names them and as the previous release did.
	tmp := filepath.Join(dir, atomicfile.TempPrefix+"att-a.json-123456")
	oldTmp := filepath.Join(dir, ".tmp-654321")
	for _, p := range []string{tmp, oldTmp} {
		if err := os.WriteFile(p, []byte(`{"claim":{"attempt_id":"att-a","wor`), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// A record corrupted on disk.
	if err := os.WriteFile(filepath.Join(dir, "att-c.json"), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A record under the wrong name.
	r := testRecord("att-d")
	if err := s.save(r); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(s.path("att-d"), filepath.Join(dir, "att-e.json")); err != nil {
		t.Fatal(err)
	}

	// Re-attach sockets: one beside its record, one whose record was
	// never written (the daemon died between the child's start and the
	// flush).
	kept, orphan := s.socket("att-a"), s.socket("att-z")
	for _, p := range []string{kept, orphan} {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	s.sweepTemp()
	for _, p := range []string{tmp, oldTmp} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("temp file %s not swept: %v", filepath.Base(p), err)
		}
	}
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Errorf("socket without a record not swept: %v", err)
	}
	if _, err := os.Stat(kept); err != nil {
		t.Errorf("socket of a persisted attempt swept: %v", err)
	}
	got, bad := s.load()
	if len(got) != 2 || got[0].Claim.AttemptID != "att-a" || got[1].Claim.AttemptID != "att-b" {
		t.Fatalf("loaded %+v", got)
	}
	if len(bad) != 2 || bad[0] != "att-c.json" || bad[1] != "att-e.json" {
		t.Fatalf("bad %v", bad)
	}
	if _, err := os.Stat(filepath.Join(dir, "att-c.json.corrupt")); err != nil {
		t.Fatalf("corrupt record not kept aside: %v", err)
	}
	if got, bad := s.load(); len(got) != 2 || len(bad) != 0 {
		t.Fatalf("second load: %d records, bad %v", len(got), bad)
	}
}

func TestStateRefusesBadAttemptID(t *testing.T) {
	s, err := openStateDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"", "../x", `a\b`} {
		if err := s.save(testRecord(id)); err == nil {
			t.Errorf("save(%q) succeeded", id)
		}
	}
}
