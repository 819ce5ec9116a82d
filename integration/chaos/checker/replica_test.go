package checker

import (
	"testing"
	"time"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/wire"
)

// via records one call of host through replica, sent at s and answered
// at s+0.02 with status.
func (h *hist) via(s float64, host, replica, call, att string, status int) *hist {
	a := h.at(s + 0.02)
	hr := &HTTP{Method: "POST", Call: call, Sent: h.at(s), Answered: &a, Status: status}
	job := ""
	if call == CallHostHeartbeat {
		hr.Path = wire.PathHostHeartbeat
	} else {
		job = "j-" + att
		hr.Path = wire.AttemptPath(job, call)
	}
	return h.add(Record{Time: a, Host: host, Replica: replica, JobID: job, AttemptID: att, HTTP: hr})
}

// beats records host's heartbeats every 0.3 s in [from, to), through
// cp1 before at and cp2 from it.
func (h *hist) beats(host string, from, to, at float64) *hist {
	for s := from; s < to; s += 0.3 {
		h.via(s, host, map[bool]string{true: "cp1", false: "cp2"}[s < at], CallHostHeartbeat, "", 200)
	}
	return h
}

// TestReplicaLossCostsNothing: a replica killed at 100 s and started again
// at 102 s. A host whose heartbeats and renewals move to the other
// replica at once is clean, and its renewal gap is measured; a host that
// was using the killed replica and whose heartbeats then stop for longer
// than the offline bound, or whose turn child writes that its lease
// expired, is a finding; a pause of a host that was not using it is not
// the loss's; a cost on a host another fault touched then (but not one on
// its path to the lost replica) is set aside.
func TestReplicaLossCostsNothing(t *testing.T) {
	build := func(t *testing.T, bad func(h *hist)) (Report, []Record) {
		h := newHist(t)
		for _, host := range []string{"h1", "h2", "h3"} {
			h.add(Record{Time: h.at(0), Host: host, Process: &Process{Role: RoleDaemon, Event: ProcessStart, PID: 1}})
			h.add(Record{Time: h.at(1), Host: host, Server: &Server{State: wire.HostOnline, HeartbeatIntervalMS: 300}})
		}
		h.fault(100, 102, "", "", FaultKill, RoleReplica)
		h.recs[len(h.recs)-1].Replica = "cp1"
		h.beats("h1", 90, 110, 100.1)
		// a1 on h1 renews through cp1 until the kill, then through cp2.
		for s := 96.0; s < 100; s += 0.4 {
			h.via(s, "h1", "cp1", wire.OpRenew, "a1", 200)
		}
		h.via(100.05, "h1", "cp1", wire.OpRenew, "a1", 0)
		h.recs[len(h.recs)-1].HTTP.Status, h.recs[len(h.recs)-1].HTTP.Answered = 0, nil
		h.via(100.35, "h1", "cp2", wire.OpRenew, "a1", 200)
		h.via(100.75, "h1", "cp2", wire.OpRenew, "a1", 200)
		// h3 was cut off across the kill: its gap is set aside.
		h.fault(99, 101, "h3", "", FaultPartition, RoleHost)
		h.beats("h3", 90, 99, 200).beats("h3", 101.5, 110, 100.1)
		bad(h)
		return h.check()
	}

	t.Run("clean", func(t *testing.T) {
		rep, _ := build(t, func(h *hist) { h.beats("h2", 90, 110, 100.1) })
		if !rep.Clean() {
			t.Fatalf("violations:\n%s", rep.Summary())
		}
		if rep.Totals.ReplicaLosses != 1 || rep.Totals.ReplicaJudged != 3 || rep.Totals.ReplicaExcused != 1 {
			t.Fatalf("losses %d, judged %d, set aside %d; want 1, 3 and 1 (h3's gap: a fault of its own)",
				rep.Totals.ReplicaLosses, rep.Totals.ReplicaJudged, rep.Totals.ReplicaExcused)
		}
		// The last renewal answered through cp1 (99.62) to the first
		// through cp2 (100.37).
		if g := rep.Totals.FailoverGaps; len(g) != 1 || g[0].Round(time.Millisecond) != 750*time.Millisecond {
			t.Fatalf("failover gaps %v, want [750ms]", g)
		}
	})
	t.Run("heartbeats stop", func(t *testing.T) {
		rep, recs := build(t, func(h *hist) { h.beats("h2", 90, 100, 200).beats("h2", 101.5, 110, 0) })
		f := only(t, rep, recs, ReplicaOffline, 1)[0]
		cites(t, f, recs, func(r Record) bool { return r.Fault != nil && r.Fault.Kind == FaultKill })
	})
	t.Run("a gap not the replica's", func(t *testing.T) {
		// h2 heartbeats through cp2 only: a pause of its own (a loaded
		// machine), and Admin → Servers reading it offline, are not the
		// loss's.
		rep, _ := build(t, func(h *hist) {
			h.beats("h2", 90, 100, 0).beats("h2", 101.5, 110, 0)
			h.add(Record{Time: h.at(100.8), Host: "h2", Server: &Server{State: wire.HostOffline, HeartbeatIntervalMS: 300}})
		})
		if !rep.Clean() {
			t.Fatalf("violations:\n%s", rep.Summary())
		}
	})
	t.Run("lease expired", func(t *testing.T) {
		rep, recs := build(t, func(h *hist) {
			h.beats("h2", 90, 110, 100.1)
			h.add(Record{Time: h.at(101), Host: "h2", AttemptID: "a2", Daemon: &Daemon{Msg: diagnostics.MsgLeaseExpired}})
			h.via(101.2, "h2", "cp2", wire.OpRenew, "a2", 409)
			h.recs[len(h.recs)-1].HTTP.Code = wire.CodeLeaseLost
		})
		only(t, rep, recs, ReplicaLease, 2)
	})
	t.Run("a renewal racing its own accepted finish", func(t *testing.T) {
		// K1 renews while the report is in flight: the renewal answered
		// after the finish committed is refused, which is no lease the
		// replica's loss cost; the daemon's record of it neither.
		rep, _ := build(t, func(h *hist) {
			h.beats("h2", 90, 110, 100.1)
			h.via(101, "h2", "cp2", wire.OpFinish, "a3", 200)
			h.event("j-a3", "a3", "finished", wire.FinishRequest{Outcome: wire.OutcomeSucceeded})
			h.via(101.01, "h2", "cp2", wire.OpRenew, "a3", 409)
			h.recs[len(h.recs)-1].HTTP.Code = wire.CodeLeaseLost
			h.add(Record{Time: h.at(101.04), Host: "h2", JobID: "j-a3", AttemptID: "a3", Daemon: &Daemon{Msg: diagnostics.MsgLeaseLost}})
		})
		if n := rep.Count(ReplicaLease); n != 0 {
			t.Fatalf("%d leases counted lost through the replica's loss, want 0:\n%s", n, rep.Summary())
		}
	})
	t.Run("a fault on the path to the lost replica", func(t *testing.T) {
		// It cannot cost the host anything: that replica is down anyway.
		rep, recs := build(t, func(h *hist) {
			h.beats("h2", 90, 100, 200).beats("h2", 101.5, 110, 0)
			h.fault(99.5, 100.5, "h2", "", FaultTimeout, "")
			h.recs[len(h.recs)-1].Replica = "cp1"
		})
		only(t, rep, recs, ReplicaOffline, 1)
	})
	t.Run("another fault on the host", func(t *testing.T) {
		rep, _ := build(t, func(h *hist) {
			h.beats("h2", 90, 100, 200).beats("h2", 101.5, 110, 0)
			h.fault(99.5, 100.5, "h2", "", FaultKill, RoleDaemon)
		})
		if !rep.Clean() || rep.Totals.ReplicaExcused != 2 {
			t.Fatalf("set aside %d, want 2 (h2's and h3's gaps); violations:\n%s", rep.Totals.ReplicaExcused, rep.Summary())
		}
	})
}
