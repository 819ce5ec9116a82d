package sdscope

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/godbus/dbus/v5"
)

// Without systemd there is no Manager, and the reason says why: no unit
// started this process, or the system bus does not answer. The real
// manager is tested under a real systemd by
// integration.TestSystemdRestartKeepsScopes.
func TestDetectFallsBack(t *testing.T) {
	noBus := "unix:path=" + filepath.Join(t.TempDir(), "no-bus")
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{name: "no systemd", env: map[string]string{}, want: ReasonNotAService},
		{name: "a unit without a bus", env: map[string]string{"INVOCATION_ID": "0123abcd"}, want: ReasonNoBus},
		{name: "notify without a bus", env: map[string]string{"NOTIFY_SOCKET": "/run/systemd/notify"}, want: ReasonNoBus},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("DBUS_SYSTEM_BUS_ADDRESS", noBus)
			m, why := Detect(context.Background(), func(k string) string { return tc.env[k] })
			if m != nil {
				m.Close()
				t.Fatal("a Manager without systemd")
			}
			if why != tc.want {
				t.Errorf("reason %q, want %q", why, tc.want)
			}
		})
	}
}

func TestClass(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want string
	}{
		{"polkit refused", context.Background(), dbus.Error{Name: "org.freedesktop.DBus.Error.AccessDenied"}, ClassAccessDenied},
		{"interactive auth", context.Background(), fmt.Errorf("x: %w", &dbus.Error{Name: "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired"}), ClassAccessDenied},
		{"other bus error", context.Background(), dbus.Error{Name: "org.freedesktop.systemd1.UnitExists"}, ClassBus},
		{"timed out", cancelled, errors.New("context canceled"), ClassTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := &Error{Class: classOf(tc.ctx, tc.err), Err: tc.err}
			if got := (*Manager)(nil).Class(fmt.Errorf("place: %w", err)); got != tc.want {
				t.Errorf("class %q, want %q", got, tc.want)
			}
		})
	}
	if got := (*Manager)(nil).Class(errors.New("not ours")); got != ClassBus {
		t.Errorf("an error Place did not make: %q", got)
	}
}

func TestUnitName(t *testing.T) {
	if got := (*Manager)(nil).Unit("job_abc", "att_1/2"); got != `runnerd-turn-job_abc-att_1-2.scope` {
		t.Errorf("unit %q", got)
	}
}

// Hierarchy agrees with the mount table, read independently: cgroup2 at
// /sys/fs/cgroup is unified; a tmpfs there with cgroup2 at unified/ is
// hybrid, with only v1 hierarchies legacy. A directory that is none of
// these is unknown.
func TestHierarchyMatchesTheMountTable(t *testing.T) {
	raw, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Skip("no /proc/self/mounts")
	}
	types := map[string]string{}
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) >= 3 {
			types[f[1]] = f[2] // the last mount over a point is the one seen
		}
	}
	want := HierarchyUnknown
	switch {
	case types["/sys/fs/cgroup"] == "cgroup2":
		want = HierarchyUnified
	case types["/sys/fs/cgroup"] == "tmpfs" && types["/sys/fs/cgroup/unified"] == "cgroup2":
		want = HierarchyHybrid
	case types["/sys/fs/cgroup"] == "tmpfs" && types["/sys/fs/cgroup/systemd"] == "cgroup":
		want = HierarchyLegacy
	}
	if got := Hierarchy(); got != want {
		t.Errorf("Hierarchy() = %q, the mount table says %q (%v)", got, want, types["/sys/fs/cgroup"])
	}
	if got := hierarchyAt(t.TempDir()); got != HierarchyUnknown {
		t.Errorf("a plain directory is %q, want %q", got, HierarchyUnknown)
	}
}
