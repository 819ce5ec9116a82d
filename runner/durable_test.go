package runner

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/runnerd/runnerd/internal/atomicfile"
	"github.com/runnerd/runnerd/internal/atomicfile/stracetest"
)

// TestS7AttemptRecordIsDurable: under strace, persisting an attempt and
// replacing its record (the terminal report added) each write a temporary
// file, sync it, rename it and sync the attempts directory before save
// returns.
func TestS7AttemptRecordIsDurable(t *testing.T) {
	save := func(withReport bool) func(root string) error {
		return func(root string) error {
			s, err := openStateDir(root)
			if err != nil {
				return err
			}
			r := testRecord("att-a")
			if withReport {
				r.Result = []byte(`{"outcome":"succeeded"}`)
			}
			return s.save(r)
		}
	}
	stracetest.Durable(t, save(false), save(true))
}

// TestS7ClusterPinIsDurable: under strace, pinning the cluster identity at
// first contact writes, syncs and renames the pin and syncs the state
// directory before the pin is trusted.
func TestS7ClusterPinIsDurable(t *testing.T) {
	stracetest.Durable(t, func(root string) error {
		if _, why := loadClusterPin(root).check("cluster-a"); why != "" {
			return fmt.Errorf("the first identity was not pinned: %s", why)
		}
		return nil
	})
}

// TestS7CrashedRecordWriteIsSwept: a daemon killed while it replaces an
// attempt's record leaves the record it had and a temporary file, which
// the next start's sweep removes; the record then loads as it was.
func TestS7CrashedRecordWriteIsSwept(t *testing.T) {
	before := testRecord("att-a")
	root := stracetest.Crash(t, func(root string) {
		s, err := openStateDir(root)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.save(before); err != nil {
			t.Fatal(err)
		}
	}, func(root string) error {
		s, err := openStateDir(root)
		if err != nil {
			return err
		}
		r := testRecord("att-a")
		r.Result = []byte(`{"outcome":"succeeded"}`)
		return s.save(r)
	})
	dir := filepath.Join(root, "attempts")
	left, _ := filepath.Glob(filepath.Join(dir, atomicfile.TempPrefix+"att-a.json-*"))
	if len(left) != 1 {
		t.Fatalf("the crashed save left %v, want one temporary file", left)
	}
	s, err := openStateDir(root)
	if err != nil {
		t.Fatal(err)
	}
	s.sweepTemp()
	if _, err := os.Stat(left[0]); !os.IsNotExist(err) {
		t.Fatalf("the sweep left %s: %v", filepath.Base(left[0]), err)
	}
	got, bad := s.load()
	if len(bad) != 0 || len(got) != 1 || !reflect.DeepEqual(got[0].Claim, before.Claim) || got[0].Result != nil {
		t.Fatalf("after the crash and the sweep: %+v, bad %v", got, bad)
	}
}
