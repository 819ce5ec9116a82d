package held

import (
	"net"
	"os"
	"os/exec"
	"testing"
)

// The /proc reader sees this test's own process, and a child working below
// a directory joins the snapshot by that alone, with its role.
func TestSnapshotFindsTheTree(t *testing.T) {
	dir := t.TempDir()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep(1)")
	}
	// Started by this process, so it is also a descendant; a second one
	// started elsewhere is not looked at.
	cmd := exec.Command(sleep, "3600") // killed below; must outlive a snapshot on a loaded machine
	cmd.Dir = dir
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	// A TCP connection to itself: two TCP descriptors of this process.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sc, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()

	s, err := takeSnapshot(os.Getpid(), dir, os.Args[0], sleep)
	if err != nil {
		t.Fatal(err)
	}
	self, ok := s.procs[os.Getpid()]
	if !ok || self.use.Threads < 1 || self.use.RSSKB <= 0 || self.use.PSSKB <= 0 || self.use.FDs < 6 || self.use.TCP < 3 || self.use.TCP >= self.use.FDs {
		t.Fatalf("this process: %+v (found %v)", self.use, ok)
	}
	child, ok := s.procs[cmd.Process.Pid]
	if !ok || child.role != RoleAgent {
		t.Fatalf("the child: %+v, role %q (found %v)", child.use, child.role, ok)
	}
	if got := s.byRole()[RoleAgent].Processes; got != 1 {
		t.Fatalf("%d agents, want 1", got)
	}
	if tot := s.total(); tot.Processes != len(s.procs) || tot.Threads < 2 {
		t.Fatalf("total %+v over %d processes", tot, len(s.procs))
	}
}

func TestRoleOf(t *testing.T) {
	tests := []struct {
		name string
		argv []string
		want string
	}{
		{"daemon", []string{"/b/runnerd", "run", "--state-dir", "x"}, RoleDaemon},
		{"turn child", []string{"/b/runnerd", "turn"}, RoleTurn},
		{"supervisor", []string{"/b/runnerd", "supervise", "--socket", "s"}, RoleSupervisor},
		{"lean turn child", []string{"/b/runnerd-child", "turn"}, RoleTurn},
		{"lean supervisor", []string{"/b/runnerd-child", "supervise", "--socket", "s"}, RoleSupervisor},
		{"another runnerd-child", []string{"/other/runnerd-child", "turn"}, RoleOther},
		{"agent", []string{"/b/demoagent"}, RoleAgent},
		{"another runnerd", []string{"/other/runnerd", "turn"}, RoleOther},
		{"nothing", nil, RoleOther},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := roleOf(tt.argv, "/b/runnerd", "/b/demoagent"); got != tt.want {
				t.Fatalf("roleOf(%q) = %q, want %q", tt.argv, got, tt.want)
			}
		})
	}
}
