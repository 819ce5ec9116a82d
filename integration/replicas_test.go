package integration

import (
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store/sqlstore/sqltest"
	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/runner"
	"github.com/runnerd/runnerd/wire"
)

// TestReplicaStoppedMidTurn: two control-plane processes on one PostgreSQL
// database, a daemon given both addresses (--control-plane A,B). Replica A
// is stopped while a turn runs and stays silent past several renewals: the
// renewals go on through B on their usual cadence, the turn succeeds on its
// first attempt with no lease lost, and the host stays online. When A
// serves again the daemon's calls return to it.
func TestReplicaStoppedMidTurn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{leaseTTL: calmLease, db: sqltest.PostgresSchema(t)})
	cfg2 := e.cp.Config()
	cfg2.Listen = ""
	cfg2.Log = e.log.prefixed("cp2")
	cp2, err := fleet.StartControlPlane(e.ctx, cfg2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp2.Stop(syscall.SIGTERM, 15*time.Second); err != nil {
			t.Errorf("replica B: %v", err)
		}
		cp2.User.Close()
	})
	e.user = cp2.User // the test's own calls go to the replica that stays

	d := e.startDaemon(func(c *fleet.DaemonConfig) {
		calm(c)
		c.ControlPlaneURL = e.cp.URL + "," + cp2.URL
	})
	conv := e.conversation("two replicas")
	const silent = 5 * 2 * time.Second // five renewal intervals of the calm lease
	prompt := "through a replica's stop\n!events 2\n!silent " + silent.String()
	j := e.send(conv.ID, prompt)
	e.waitJob(j.ID, "running", func(j wire.Job) bool { return j.State == wire.JobRunning })

	a := e.cp.Config()
	if err := e.cp.Stop(syscall.SIGTERM, 15*time.Second); err != nil {
		t.Fatalf("stop replica A: %v", err)
	}
	switched := regexp.MustCompile(`"msg":"` + runner.MsgControlPlaneSwitched + `".*"to":"` + regexp.QuoteMeta(cp2.URL) + `"`)
	if _, err := d.AwaitOutput(0, switched, waitFor); err != nil {
		t.Fatalf("the daemon did not move to replica B: %v", err)
	}

	got := e.waitEnded(j.ID)
	if got.State != wire.JobSucceeded || got.AttemptCount != 1 || got.WorkerLostCount != 0 {
		t.Fatalf("the turn across a replica's stop: %s", describeJob(got))
	}
	e.assertPromptsOnce(conv.ID, prompt)
	out := d.Output()
	for _, bad := range []string{diagnostics.MsgLeaseExpired, diagnostics.MsgLeaseLost} {
		if strings.Contains(out, `"msg":"`+bad+`"`) {
			t.Errorf("the daemon wrote %s", bad)
		}
	}
	e.waitServer("online through replica B", func(s wire.Server) bool { return s.State == wire.HostOnline })

	// A serves again on its address: the calls come back to it.
	a.Log = e.log.prefixed("cp1")
	a.Listen = strings.TrimPrefix(e.cp.URL, "http://") // its old address, the daemon's preferred one
	back, err := fleet.StartControlPlane(e.ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { back.Stop(syscall.SIGTERM, 15*time.Second); back.User.Close() })
	home := regexp.MustCompile(`"msg":"` + runner.MsgControlPlaneSwitched + `".*"to":"` + regexp.QuoteMeta(e.cp.URL) + `"`)
	if _, err := d.AwaitOutput(0, home, waitFor); err != nil {
		t.Fatalf("the daemon did not return to replica A: %v", err)
	}
}
