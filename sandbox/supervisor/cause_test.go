package supervisor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/wire"
)

// TestS5CauseOfAgentEnd: how the supervisor names an agent's abnormal end
// from the counters before and after it and the filesystems it writes.
// The sandbox's limits come before the exit status they caused; a counter
// that did not move, or could not be read on one side, says nothing; a
// clean exit has no cause.
func TestS5CauseOfAgentEnd(t *testing.T) {
	oomV1, oomV2 := counter{"memory/memory.oom_control", "oom_kill"}, counter{"memory.events", "oom_kill"}
	pidsV1 := counter{"pids/pids.events", "max"}
	killed := sandbox.Result{ExitCode: -1, Signal: "SIGKILL"}
	exit1 := sandbox.Result{ExitCode: 1}
	tests := []struct {
		name          string
		res           sandbox.Result
		before, after counters
		cause         wire.Cause
		evidence      string
	}{
		{"clean exit", sandbox.Result{}, counters{oomV1: 0}, counters{oomV1: 1}, "", ""},
		{"oom v1", killed, counters{oomV1: 2}, counters{oomV1: 3}, wire.CauseOOMKilled, "cgroup v1 memory/memory.oom_control oom_kill 2→3"},
		{"oom v2", killed, counters{oomV2: 0}, counters{oomV2: 1}, wire.CauseOOMKilled, "cgroup v2 memory.events oom_kill 0→1"},
		{"oom before pids", exit1, counters{oomV1: 0, pidsV1: 0}, counters{oomV1: 1, pidsV1: 5}, wire.CauseOOMKilled, "exited 1"},
		{"pids", exit1, counters{pidsV1: 0}, counters{pidsV1: 7}, wire.CausePidsExhausted, "max 0→7"},
		{"counters unmoved: signal", killed, counters{oomV1: 1, pidsV1: 1}, counters{oomV1: 1, pidsV1: 1}, wire.CauseAgentSignal, "SIGKILL"},
		{"counter unread before: exit", exit1, counters{}, counters{oomV1: 4}, wire.CauseAgentExit, "exited 1"},
		{"exit 3", sandbox.Result{ExitCode: 3}, counters{}, counters{}, wire.CauseAgentExit, "the agent exited 3"},
	}
	for _, tt := range tests {
		cause, ev := causeOf(tt.res, tt.before, tt.after, []string{t.TempDir()})
		if cause != tt.cause || !strings.Contains(ev, tt.evidence) || (tt.cause == "") != (ev == "") {
			t.Errorf("%s: causeOf = %q, %q; want %q with evidence naming %q", tt.name, cause, ev, tt.cause, tt.evidence)
		}
	}
}

// TestS5DiskFullProbe: a filesystem written full (a 1 MiB tmpfs, mounted
// by the test as root) answers the supervisor's probe with ENOSPC, and the
// agent's end is named disk_full with the free space measured; a
// filesystem with room says nothing.
func TestS5DiskFullProbe(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("cannot mount a tmpfs (%v): needs root", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	roomy := t.TempDir()
	if _, ok := diskFull([]string{roomy, dir}); ok {
		t.Fatal("a tmpfs with room is reported full")
	}
	f, err := os.Create(filepath.Join(dir, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			break
		}
	}
	f.Close()
	cause, ev := causeOf(sandbox.Result{ExitCode: 1}, counters{}, counters{}, []string{roomy, dir})
	if cause != wire.CauseDiskFull || !strings.Contains(ev, "ENOSPC writing a probe in "+dir) || !strings.Contains(ev, "0 of 1048576 bytes free") {
		t.Fatalf("causeOf on a full tmpfs = %q, %q; want disk_full with ENOSPC and the free space", cause, ev)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("the probe left files behind: %v", entries)
	}
}
