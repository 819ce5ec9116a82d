package boottime

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// K5: the alarm waits on CLOCK_BOOTTIME itself, the lease clock of every
// level, so that a deadline that passed during a suspend fires on resume;
// a timerfd on CLOCK_MONOTONIC would stop counting while the host sleeps,
// and no test that only waits for a short alarm can tell the two apart.
// The kernel says which clock the alarm's timerfd counts on.
func TestAlarmTimerfdIsOnBootClock(t *testing.T) {
	a, err := NewAlarm()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	rc, err := a.f.SyscallConn() // not Fd: that would make the descriptor blocking
	if err != nil {
		t.Fatal(err)
	}
	fd := -1
	if err := rc.Control(func(u uintptr) { fd = int(u) }); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(fd))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "clockid:"); ok {
			if id, err := strconv.Atoi(strings.TrimSpace(v)); err != nil || id != unix.CLOCK_BOOTTIME {
				t.Fatalf("the alarm's timerfd counts on clock %q, want CLOCK_BOOTTIME (%d)", strings.TrimSpace(v), unix.CLOCK_BOOTTIME)
			}
			return
		}
	}
	t.Fatalf("no clockid in the timerfd's fdinfo:\n%s", b)
}
