package sdscope

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
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
