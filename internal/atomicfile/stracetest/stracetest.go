// Package stracetest proves, for tests, that a package's real writer
// replaces its files durably (S7): it re-executes the calling test under
// strace and reads the system calls the writer made. It is imported only
// by tests.
package stracetest

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/runnerd/runnerd/internal/atomicfile"
)

// The re-executed test finds its directory here; its presence is what
// makes it the child.
const (
	envDir     = "RUNNERD_STRACETEST_DIR"
	envRequire = "RUNNERD_REQUIRE_STRACE"
)

// returned is written to stderr by the child after each write has
// returned: what the caller may rely on from then on must be on disk by
// then. Shorter than strace's default string length.
const returned = "stracetest: returned\n"

// traced are the system calls the checks read.
const traced = "openat,write,fsync,fdatasync,rename,renameat,renameat2"

// Durable runs the calling test again in a child process under
// `strace -f`, where each write is called in turn with a directory of the
// parent's making, and fails t unless every rename into that directory or
// one below it (there must be one at least) replaced the file with a
// temporary file beside it named by atomicfile, written and then synced
// before the rename, and the file's directory was synced after the rename
// and before the write returned. It skips, saying why, when strace is not
// installed, unless RUNNERD_REQUIRE_STRACE=1 (.ci/run) makes that a
// failure.
//
// In the child, Durable calls the writes and returns: the test must do
// nothing else there, so call Durable first in it.
func Durable(t *testing.T, writes ...func(dir string) error) {
	t.Helper()
	Check{}.Durable(t, writes...)
}

// Check is Durable with exceptions.
type Check struct {
	// Exempt are the names of files made by a rename that nothing needs
	// after a power loss (a log moved aside to name.1, a socket's link
	// made anew at each start): their renames are not checked. Say why
	// beside each.
	Exempt []string
}

// Durable is the package's Durable, but for c's exceptions.
func (c Check) Durable(t *testing.T, writes ...func(dir string) error) {
	t.Helper()
	for _, p := range c.durable(t, writes) {
		t.Error(p)
	}
}

// durable is Durable's run: in the parent it returns what the trace shows
// is wrong; in the child it makes the writes.
func (c Check) durable(t *testing.T, writes []func(dir string) error) []string {
	t.Helper()
	if dir, child := os.LookupEnv(envDir); child {
		for i, w := range writes {
			if err := w(dir); err != nil {
				t.Fatalf("write %d: %v", i, err)
			}
			fmt.Fprint(os.Stderr, returned)
		}
		return nil
	}
	dir, trace, _ := run(t, "")
	renames, problems := c.check(dir, parse(t, trace), len(writes))
	if len(problems) == 0 {
		t.Logf("each of %d renames under %s was of a temporary file written and synced before it, and its directory synced after it", renames, dir)
	}
	return problems
}

// Crash makes a directory, lets setup put what it likes there, and runs
// the calling test again in a child process under strace, as Durable does,
// where write is called with the directory; it kills the child (SIGKILL)
// on the write's first rename, which it makes fail: what a power loss or a
// kill leaves of a write cut short. It returns the directory, for the test
// to see what is left. In the child Crash never returns: the child is
// killed, or fails the test if the write returns.
func Crash(t *testing.T, setup func(dir string), write func(dir string) error) string {
	t.Helper()
	if d, child := os.LookupEnv(envDir); child {
		err := write(d)
		t.Fatalf("the write went on past its rename: %v", err)
	}
	dir := t.TempDir()
	setup(dir)
	dir, trace, state := run(t, dir, "-e", "inject=rename,renameat,renameat2:error=EIO:signal=KILL")
	if ws, ok := state.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the child was not killed at its rename: %v", state)
	}
	for _, c := range parse(t, trace) {
		if isRename(c.name) && ok(c) {
			t.Fatalf("the child's rename was made: %s", c.line)
		}
	}
	return dir
}

// run re-executes the calling test under strace, the child writing in dir
// (a new directory if ""), and returns the directory, the trace and how
// strace ended (as its child did). Only a crash (straceArgs) may end it
// with an error.
func run(t *testing.T, dir string, straceArgs ...string) (string, string, *os.ProcessState) {
	t.Helper()
	strace, err := exec.LookPath("strace")
	if err != nil {
		if os.Getenv(envRequire) == "1" {
			t.Fatalf("%s=1 but strace is not installed: %v", envRequire, err)
		}
		t.Skipf("strace is not installed (Debian: apt-get install strace); set %s=1 to make this a failure", envRequire)
	}
	if dir == "" {
		dir = t.TempDir()
	}
	// strace names files by their resolved paths (-y).
	dir, err = filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	trace := filepath.Join(t.TempDir(), "trace")
	args := append([]string{"-f", "-qq", "-y", "-o", trace, "-e", "trace=" + traced}, straceArgs...)
	args = append(args, "--", os.Args[0], "-test.run="+runPattern(t.Name()), "-test.count=1")
	cmd := exec.CommandContext(t.Context(), strace, args...)
	cmd.Env = append(os.Environ(), envDir+"="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil && (len(straceArgs) == 0 || cmd.ProcessState == nil) {
		t.Fatalf("the child under strace: %v\n%s", err, out)
	}
	b, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	return dir, string(b), cmd.ProcessState
}

// runPattern selects exactly the test named name (subtests included).
func runPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

// call is one system call of the trace: the lines where it began and
// ended (-1 if it never did), its name, arguments and result as strace
// printed them.
type call struct {
	start, end int
	name       string
	args       string
	result     string
	line       string
}

var (
	lineRE     = regexp.MustCompile(`^(\d+) +(.*)$`)
	fullRE     = regexp.MustCompile(`^(\w+)\((.*)\) += (.*)$`)
	unfinRE    = regexp.MustCompile(`^(\w+)\((.*) <unfinished \.\.\.>$`)
	resumedRE  = regexp.MustCompile(`^<\.\.\. (\w+) resumed>(.*)\) += (.*)$`)
	fdPathRE   = regexp.MustCompile(`^\d+<(.*)>`)
	pathRE     = regexp.MustCompile(`(?:\w+<([^>]*)>, )?"((?:[^"\\]|\\.)*)"`) // a path, after its directory descriptor if any
	renameName = map[string]bool{"rename": true, "renameat": true, "renameat2": true}
)

func isRename(name string) bool { return renameName[name] }

// parse reads strace -f output: one call a line, or split into
// "<unfinished ...>" and "<... resumed>" lines when threads interleave.
func parse(t *testing.T, trace string) []call {
	t.Helper()
	var calls []call
	open := map[string]int{} // pid → index in calls of its unfinished call
	sc := bufio.NewScanner(strings.NewReader(trace))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for i := 0; sc.Scan(); i++ {
		m := lineRE.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		pid, rest := m[1], m[2]
		if f := fullRE.FindStringSubmatch(rest); f != nil && !strings.HasPrefix(rest, "<...") {
			calls = append(calls, call{start: i, end: i, name: f[1], args: f[2], result: f[3], line: rest})
			continue
		}
		if u := unfinRE.FindStringSubmatch(rest); u != nil {
			open[pid] = len(calls)
			calls = append(calls, call{start: i, end: -1, name: u[1], args: u[2], line: rest})
			continue
		}
		if r := resumedRE.FindStringSubmatch(rest); r != nil {
			j, ok := open[pid]
			if !ok || calls[j].name != r[1] {
				t.Fatalf("trace line %d resumes a call that did not start: %s", i, rest)
			}
			delete(open, pid)
			calls[j].end, calls[j].args, calls[j].result = i, calls[j].args+r[2], r[3]
			calls[j].line += " … " + rest
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return calls
}

// fdPath is the path strace -y printed for a call's first argument, a
// descriptor.
func fdPath(c call) string {
	m := fdPathRE.FindStringSubmatch(c.args)
	if m == nil {
		return ""
	}
	return m[1]
}

func ok(c call) bool { return c.end >= 0 && (c.result == "0" || strings.HasPrefix(c.result, "0 ")) }

func isSync(c call) bool { return c.name == "fsync" || c.name == "fdatasync" }

// renamePaths are a rename's old and new paths, made absolute from the
// directory descriptors strace -y resolved; "" if they cannot be.
func renamePaths(c call) (string, string) {
	q := pathRE.FindAllStringSubmatch(c.args, -1)
	if len(q) < 2 {
		return "", ""
	}
	abs := func(m []string) string {
		switch {
		case filepath.IsAbs(m[2]):
			return m[2]
		case filepath.IsAbs(m[1]):
			return filepath.Join(m[1], m[2])
		}
		return ""
	}
	return abs(q[0]), abs(q[1])
}

// check returns how many renames into dir the trace holds and what is
// wrong with them.
func (ck Check) check(dir string, calls []call, writes int) (int, []string) {
	var problems []string
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	var marks []int // where each write had returned
	for _, c := range calls {
		if c.name == "write" && strings.Contains(c.args, `"`+strings.TrimSuffix(returned, "\n")+`\n"`) {
			marks = append(marks, c.start)
		}
	}
	if len(marks) != writes {
		return 0, []string{fmt.Sprintf("the child returned from %d writes, want %d", len(marks), writes)}
	}
	renames := 0
	for _, r := range calls {
		if !isRename(r.name) {
			continue
		}
		old, target := renamePaths(r)
		if !strings.HasPrefix(target, dir+"/") || slices.Contains(ck.Exempt, filepath.Base(target)) {
			continue
		}
		parent := filepath.Dir(target)
		renames++
		if !ok(r) {
			fail("a rename into the directory failed: %s", r.line)
			continue
		}
		if filepath.Dir(old) != parent || !strings.HasPrefix(filepath.Base(old), atomicfile.TempPrefix+filepath.Base(target)+"-") {
			fail("%s was not replaced by a temporary file of atomicfile's naming beside it: %s", target, r.line)
		}
		// The file: written, then synced, before the rename.
		lastWrite, synced := -1, -1
		for _, c := range calls {
			if c.start >= r.start || fdPath(c) != old {
				continue
			}
			switch {
			case c.name == "write":
				lastWrite = c.start
			case isSync(c) && ok(c) && c.end < r.start:
				synced = c.start
			}
		}
		switch {
		case lastWrite < 0:
			fail("nothing was written to %s before its rename", old)
		case synced < lastWrite:
			fail("%s was not synced after its last write and before its rename (%s)", old, r.line)
		}
		// The directory: synced after the rename, before the write
		// returned.
		next := -1
		for _, m := range marks {
			if m > r.end {
				next = m
				break
			}
		}
		if next < 0 {
			fail("the write that renamed %s never returned", target)
			continue
		}
		dirSynced := false
		for _, c := range calls {
			if isSync(c) && ok(c) && fdPath(c) == parent && c.start > r.end && c.end < next {
				dirSynced = true
			}
		}
		if !dirSynced {
			fail("the directory %s was not synced after the rename of %s and before the write returned", parent, target)
		}
	}
	if renames == 0 {
		fail("nothing was renamed under %s: the writes did not replace a file there", dir)
	}
	return renames, problems
}
