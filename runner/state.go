package runner

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/runnerd/runnerd/internal/atomicfile"
	"github.com/runnerd/runnerd/internal/boottime"
	"github.com/runnerd/runnerd/settlement"
	"github.com/runnerd/runnerd/wire"
)

// record is what the state directory keeps of one claimed attempt. It holds
// the worker token, so its file is 0600 and it is never logged.
type record struct {
	Claim     wire.Claim `json:"claim"`
	ClaimedAt time.Time  `json:"claimed_at"`
	// ClaimedBoot is the claim on CLOCK_BOOTTIME, which the execution
	// timeout of a re-attached turn counts from: a step of the wall clock
	// moves neither. Zero in a record of a release before it.
	ClaimedBoot boottime.Instant `json:"claimed_boot,omitempty"`
	// Report is the terminal report, persisted before it is sent so that a
	// daemon restarted before the answer re-sends the same idempotent
	// report (P2). Exactly one of Finish, Release, Abandon is set.
	Report *settlement.Report `json:"report,omitempty"`
	// Result is the turn child's RESULT, persisted before the child is told
	// the daemon has it (KEPT): a daemon restarted before the report was
	// built builds it from this (P5).
	Result json.RawMessage `json:"result,omitempty"`
}

// stateDir is the daemon's state directory: one file per live attempt under
// attempts/, written atomically.
type stateDir struct {
	root string
	// busy admits stateIOWidth writers (save, remove) at a time. Each one
	// blocks its OS thread in fsync, rename or unlink, all of them queued on
	// the one directory's lock in the kernel: without a bound, a thousand
	// turns ending together (a mass cancel, a drain) would make the runtime
	// start a thread for each. Waiting here parks a goroutine.
	busy chan struct{}
}

// stateIOWidth is how many state-directory writes run at once: enough to
// overlap one write's fsync with the next one's rename.
const stateIOWidth = 4

func (s stateDir) acquire() (release func()) {
	s.busy <- struct{}{}
	return func() { <-s.busy }
}

func openStateDir(root string) (stateDir, error) {
	if root == "" {
		return stateDir{}, errors.New("state directory: not set")
	}
	dir := filepath.Join(root, "attempts")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return stateDir{}, fmt.Errorf("state directory: %w", err)
	}
	// The files hold worker tokens: nobody else may even list them.
	if err := os.Chmod(dir, 0o700); err != nil {
		return stateDir{}, fmt.Errorf("state directory: %w", err)
	}
	return stateDir{root: root, busy: make(chan struct{}, stateIOWidth)}, nil
}

func (s stateDir) path(attemptID string) string {
	return filepath.Join(s.root, "attempts", attemptID+".json")
}

// save writes the record durably, 0600 (atomicfile.Write).
func (s stateDir) save(r record) error {
	if r.Claim.AttemptID == "" || strings.ContainsAny(r.Claim.AttemptID, `/\`) {
		return errors.New("persist attempt: bad attempt id")
	}
	defer s.acquire()()
	b, err := json.Marshal(r)
	if err == nil {
		err = atomicfile.Write(s.path(r.Claim.AttemptID), b, 0o600)
	}
	if err != nil {
		return fmt.Errorf("persist attempt %s: %w", r.Claim.AttemptID, err)
	}
	return nil
}

// socket is the path of the attempt's re-attach socket (P5): beside its
// record, in the 0700 directory, so only the daemon's user reaches it.
func (s stateDir) socket(attemptID string) string {
	return filepath.Join(s.root, "attempts", attemptID+".sock")
}

// remove forgets an attempt whose report was acknowledged or definitively
// refused, or that is no longer ours. It does not sync the directory: a
// record a crash brings back costs the next start one lease question
// (restart.go), which an ended or released attempt fails — the record is
// forgotten then, nothing is sent or run again — while a sync here would
// cost every turn one more flush.
func (s stateDir) remove(attemptID string) error {
	defer s.acquire()()
	_ = os.Remove(s.socket(attemptID)) // a dead child's, if any
	if err := os.Remove(s.path(attemptID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("forget attempt %s: %w", attemptID, err)
	}
	return nil
}

// load returns every persisted attempt, oldest claim first, and the names
// of files that could not be read as one; those are renamed *.corrupt, so
// that they are kept for an operator but not read again.
func (s stateDir) load() ([]record, []string) {
	dir := filepath.Join(s.root, "attempts")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, []string{"attempts"}
	}
	var (
		out []record
		bad []string
	)
	for _, e := range ents {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".json") {
			continue
		}
		var r record
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err == nil {
			err = json.Unmarshal(b, &r)
		}
		if err == nil && r.Claim.AttemptID+".json" != name {
			err = errors.New("attempt id does not match the file name")
		}
		if err != nil {
			bad = append(bad, name)
			_ = os.Rename(filepath.Join(dir, name), filepath.Join(dir, name+".corrupt"))
			continue
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ClaimedAt.Before(out[j].ClaimedAt) })
	return out, bad
}

// exists reports whether the attempt is still persisted.
func (s stateDir) exists(attemptID string) bool {
	_, err := os.Stat(s.path(attemptID))
	return err == nil
}

// sweepTemp removes temporary files a crash left behind mid-write; the
// files they were to replace are intact (the rename never happened). It
// removes too every re-attach socket without a record: its child was
// started before the record was flushed (claimed) and the daemon died in
// between, so the child had no payload and exited at its EOF.
func (s stateDir) sweepTemp() {
	dir := filepath.Join(s.root, "attempts")
	_ = atomicfile.RemoveLeftovers(dir) // what is left is never read: load reads *.json
	socks, _ := filepath.Glob(filepath.Join(dir, "*.sock"))
	for _, sock := range socks {
		if !s.exists(strings.TrimSuffix(filepath.Base(sock), ".sock")) {
			_ = os.Remove(sock)
		}
	}
}
