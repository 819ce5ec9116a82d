// Package sdscope moves a process into a transient systemd scope of its
// own (the manager's D-Bus StartTransientUnit with PIDs), so that it
// outlives the service that started it: at the end of a stop of
// runnerd.service (KillMode=mixed) systemd kills what is left in the
// service's cgroup, and a scope is not in it.
//
// Only cmd/runnerd imports this package; the runner sees it through its
// own small interface (runner.Scopes).
package sdscope

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/coreos/go-systemd/v22/unit"
	"github.com/godbus/dbus/v5"
	"golang.org/x/sys/unix"
)

// Mechanism is the name records give this way of keeping turns.
const Mechanism = "systemd_scope"

// Reasons Detect gives for using no scope.
const (
	ReasonNotAService   = "not_a_systemd_service" // neither INVOCATION_ID nor NOTIFY_SOCKET: no systemd started us
	ReasonNoBus         = "no_system_bus"         // the system bus does not answer
	ReasonAccessDenied  = ClassAccessDenied       // the manager refuses this user transient units (polkit)
	ReasonProbeTimedOut = "probe_timeout"         // the manager did not answer the probe in time
)

// Classes of Place's errors (Class).
const (
	ClassAccessDenied = "access_denied" // the manager refused (polkit, a non-root caller)
	ClassJob          = "job_failed"    // the start job did not end "done"
	ClassTimeout      = "timeout"
	ClassBus          = "bus_error"
)

// timeout bounds one Place: the child waits for its payload meanwhile.
const timeout = 5 * time.Second

// Manager starts scopes through one connection to the system bus.
type Manager struct {
	conn *sddbus.Conn
}

// Detect returns a Manager when this process runs as a systemd service
// (systemd sets INVOCATION_ID for every unit it starts), the system bus
// answers and the manager lets this user start transient units; otherwise
// nil and the reason, for the start record. The connection lasts until ctx
// ends or Close.
//
// The permission is probed with a scope of no process, which the manager
// refuses to load after its access check: Access denied (an unprivileged
// user without a polkit grant) means no scopes, anything else means the
// check passed. The probe leaves no unit behind.
func Detect(ctx context.Context, getenv func(string) string) (*Manager, string) {
	if getenv("INVOCATION_ID") == "" && getenv("NOTIFY_SOCKET") == "" {
		return nil, ReasonNotAService
	}
	conn, err := sddbus.NewSystemConnectionContext(ctx)
	if err != nil {
		return nil, ReasonNoBus
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	probe := fmt.Sprintf("runnerd-probe-%d.scope", os.Getpid())
	if _, err := conn.StartTransientUnitContext(pctx, probe, "fail", nil, nil); err != nil {
		switch classOf(pctx, err) {
		case ClassAccessDenied:
			conn.Close()
			return nil, ReasonAccessDenied
		case ClassTimeout:
			conn.Close()
			return nil, ReasonProbeTimedOut
		}
	}
	return &Manager{conn: conn}, ""
}

// Close closes the bus connection.
func (m *Manager) Close() { m.conn.Close() }

// Unit is the scope of one attempt: runnerd-turn-<job>-<attempt>.scope,
// each id escaped as systemd escapes unit names.
func (*Manager) Unit(jobID, attemptID string) string {
	return "runnerd-turn-" + unit.UnitNameEscape(jobID) + "-" + unit.UnitNameEscape(attemptID) + ".scope"
}

// Place moves pid into a new scope named name and waits until systemd
// says the scope started. Whatever pid starts afterwards is in the scope
// too. The scope goes away when its last process exits.
func (m *Manager) Place(ctx context.Context, pid int, name string) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	props := []sddbus.Property{
		sddbus.PropDescription("runnerd turn (" + strings.TrimSuffix(name, ".scope") + ")"),
		sddbus.PropPids(uint32(pid)),
		// Gone from `systemctl list-units` once it ends, failed or not.
		{Name: "CollectMode", Value: dbus.MakeVariant("inactive-or-failed")},
	}
	done := make(chan string, 1)
	if _, err := m.conn.StartTransientUnitContext(ctx, name, "fail", props, done); err != nil {
		return &Error{Class: classOf(ctx, err), Err: fmt.Errorf("start scope %s for pid %d: %w", name, pid, err)}
	}
	select {
	case res := <-done:
		if res != "done" {
			return &Error{Class: ClassJob, Err: fmt.Errorf("start scope %s for pid %d: job %s", name, pid, res)}
		}
		return nil
	case <-ctx.Done():
		return &Error{Class: ClassTimeout, Err: fmt.Errorf("start scope %s for pid %d: %w", name, pid, ctx.Err())}
	}
}

// Error is Place's error: a class for records, the cause for people.
type Error struct {
	Class string
	Err   error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Class is err's class, ClassBus for an error Place did not make.
func (*Manager) Class(err error) string {
	if e := (*Error)(nil); errors.As(err, &e) {
		return e.Class
	}
	return ClassBus
}

func classOf(ctx context.Context, err error) string {
	var name string
	if de := (dbus.Error{}); errors.As(err, &de) {
		name = de.Name
	} else if dp := (*dbus.Error)(nil); errors.As(err, &dp) {
		name = dp.Name
	}
	switch {
	case ctx.Err() != nil:
		return ClassTimeout
	case name == "org.freedesktop.DBus.Error.AccessDenied" || name == "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired":
		return ClassAccessDenied
	case errors.Is(err, os.ErrPermission):
		return ClassAccessDenied
	}
	return ClassBus
}

// The cgroup hierarchies systemd knows (its own words), which Hierarchy
// tells apart for the start record.
const (
	HierarchyUnified = "unified" // cgroup v2 alone
	HierarchyHybrid  = "hybrid"  // v1 controllers, with v2 beside them (systemd's unified/ mount)
	HierarchyLegacy  = "legacy"  // cgroup v1 alone
	HierarchyUnknown = "unknown" // no cgroup file system where systemd mounts it
)

// Hierarchy says which cgroup hierarchy the host runs, read from the file
// system types under /sys/fs/cgroup as systemd reads them. Scopes keep a
// turn through a restart or a crash of the daemon on each of them (each
// scope is a cgroup of its own in systemd's hierarchy, outside the
// service's); the record says which a host has, so that what an operator
// sees can be matched with what was tested.
func Hierarchy() string {
	return hierarchyAt("/sys/fs/cgroup")
}

func hierarchyAt(root string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return HierarchyUnknown
	}
	switch st.Type {
	case unix.CGROUP2_SUPER_MAGIC:
		return HierarchyUnified
	case unix.TMPFS_MAGIC:
		if unix.Statfs(filepath.Join(root, "unified"), &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			return HierarchyHybrid
		}
		if unix.Statfs(filepath.Join(root, "systemd"), &st) == nil && st.Type == unix.CGROUP_SUPER_MAGIC {
			return HierarchyLegacy
		}
	}
	return HierarchyUnknown
}
