package checker

import (
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/wire"
)

// A replica's kill (kill -9) or restart (SIGTERM, down for the fault's
// length) must cost a host that lists every replica's address nothing
// (the daemon moves to the next address on a transport failure or 5xx): no host offline, no
// lease lost. The checker judges that for every such loss and every host,
// from the loss's start to replicaAfter past its end. A cost it finds is
// set aside (counted, not a violation) when another fault that can cause
// it touched the host from replicaBefore before it: a fault of the host
// itself, its processes, or its path to another replica, or a fault of
// another replica or of the database. A fault on the host's path to the
// lost replica cannot: that replica is down anyway.
const (
	// replicaBefore covers the tail of an earlier fault: a lease it let
	// run out is answered lease_lost at the next renewal, a lease and
	// the reaper's grace later at most.
	replicaBefore = 4 * time.Second
	// replicaAfter covers the return to the preferred replica once it
	// serves again.
	replicaAfter = 2 * time.Second
)

// replicaLoss says a fault takes a replica away for the hosts: a kill or
// a restart of one. (A stopped or cut-off replica is judged by the other
// properties only: a request to it ends by the caller's timeout, which
// may outlast the offline bound.)
func replicaLoss(r *Record) bool {
	f := r.Fault
	return f != nil && f.Role == RoleReplica && r.Replica != "" && f.End != nil &&
		(f.Kind == FaultKill || f.Kind == FaultRestart)
}

// replicaJudged is one replica loss and one host judged through it.
type replicaJudged struct {
	fault *Record
	host  string
}

// replicaPairs are the (replica loss, host) pairs the replica properties
// judge: every loss, every host with a daemon in the history.
func (h *history) replicaPairs() []replicaJudged {
	hosts := map[string]bool{}
	for _, r := range h.procs {
		if r.Process.Role == RoleDaemon && r.Host != "" {
			hosts[r.Host] = true
		}
	}
	names := make([]string, 0, len(hosts))
	for n := range hosts {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []replicaJudged
	for _, f := range h.faults {
		if replicaLoss(f) {
			for _, host := range names {
				out = append(out, replicaJudged{fault: f, host: host})
			}
		}
	}
	return out
}

// otherFault is the first fault other than the loss p that can cost
// p.host its online state or a lease and touched it within [from, to].
func (h *history) otherFault(p replicaJudged, from, to time.Time) *Record {
	from = from.Add(-replicaBefore)
	for _, g := range h.faults {
		if g == p.fault || g.Replica == p.fault.Replica || (g.Host != "" && g.Host != p.host) {
			continue
		}
		end := h.end
		if g.Fault.End != nil {
			end = *g.Fault.End
		}
		if g.Fault.Start.Before(to) && !end.Before(from) {
			return g
		}
	}
	return nil
}

// replicaCosts finds, for every judged pair, the host offline across the
// loss — its committed heartbeats further apart than
// wire.OfflineAfterIntervals of its interval — and
// every lease it lost there: its daemon's record of a lease expired or
// lost, or an attempt-scoped call of it answered lease_lost.
// excused counts the costs set aside for another fault.
func (h *history) replicaCosts(excused *int) []Finding {
	var beats map[string][]*Record // host → 2xx heartbeats, by Sent
	var servers map[string][]*Record
	var failed map[string][]*Record // host → heartbeats not committed
	var out []Finding
	for _, p := range h.replicaPairs() {
		if beats == nil {
			beats, servers, failed = map[string][]*Record{}, map[string][]*Record{}, map[string][]*Record{}
			for i := range h.recs {
				r := &h.recs[i]
				switch {
				case r.Kind == KindHTTP && r.HTTP.Call == CallHostHeartbeat && ok2xx(r.HTTP.Status) && r.HTTP.Answered != nil:
					beats[r.Host] = append(beats[r.Host], r)
				case r.Kind == KindHTTP && r.HTTP.Call == CallHostHeartbeat && !ok2xx(r.HTTP.Status):
					failed[r.Host] = append(failed[r.Host], r)
				case r.Kind == KindServer:
					servers[r.Host] = append(servers[r.Host], r)
				}
			}
			for _, bs := range beats {
				sort.SliceStable(bs, func(a, b int) bool { return bs[a].HTTP.Sent.Before(bs[b].HTTP.Sent) })
			}
		}
		f := p.fault
		from, to := f.Fault.Start, f.Fault.End.Add(replicaAfter)
		subject := fmt.Sprintf("%s through %s %s", p.host, f.Replica, f.Fault.Kind)
		in := func(t time.Time) bool { return !t.Before(from) && !t.After(to) }

		// Offline, as the control plane judges it (wire.HostState): its
		// committed heartbeats further apart than the bound, the gap
		// the replica's loss's — the heartbeat before it went through
		// the lost replica, or one through it failed within it. Admin →
		// Servers (the Server records) is not the judge: its read races
		// the heartbeat's commit, and on a loaded machine showed a host
		// offline for 90 ms with no fault at all.
		var off *Finding
		interval := wire.DefaultHeartbeatInterval
		for _, s := range servers[p.host] {
			if s.Server.HeartbeatIntervalMS > 0 {
				interval = time.Duration(s.Server.HeartbeatIntervalMS) * time.Millisecond
			}
		}
		bound := wire.OfflineAfterIntervals * interval
		bs := beats[p.host]
		for i := 1; i < len(bs) && off == nil; i++ {
			prev, next := bs[i-1], bs[i]
			// The commits were at least this far apart: the answer of
			// one, the arrival of the next.
			gap := next.HTTP.Sent.Sub(*prev.HTTP.Answered)
			if gap <= bound || !prev.HTTP.Answered.Before(to) || !next.HTTP.Sent.After(from) {
				continue
			}
			ev := []int{f.Line, prev.Line, next.Line}
			hit := prev.Replica == f.Replica
			for _, r := range failed[p.host] {
				if r.Replica == f.Replica && !r.HTTP.Sent.Before(prev.HTTP.Sent) && r.HTTP.Sent.Before(next.HTTP.Sent) {
					hit, ev = true, append(ev, r.Line)
					break
				}
			}
			if hit && h.otherFault(p, *prev.HTTP.Answered, next.HTTP.Sent) != nil {
				*excused++
			} else if hit {
				off = &Finding{Property: ReplicaOffline, Subject: subject,
					Detail: fmt.Sprintf("no heartbeat committed for %v (offline after %v) across the loss of replica %s", gap.Round(time.Millisecond), bound, f.Replica),
					Lines:  ev}
			}
		}
		if off != nil {
			out = append(out, *off)
		}

		// Leases.
		for i := range h.recs {
			r := &h.recs[i]
			if r.Host != p.host || !in(r.Time) {
				continue
			}
			lease := r.Kind == KindDaemon && (r.Daemon.Msg == diagnostics.MsgLeaseExpired || r.Daemon.Msg == diagnostics.MsgLeaseLost) ||
				r.Kind == KindHTTP && IsAttemptWrite(r.HTTP.Call) && r.HTTP.Code == wire.CodeLeaseLost
			if lease && h.finishedOwn(r.JobID, r.AttemptID) {
				// The attempt's own report was accepted, so its lease held
				// until that commit: a renewal answered lease_lost after it
				// (sent while the report was in flight, as K1 renews) is
				// the race with its own finish, not a lease the replica's
				// loss cost.
				continue
			}
			if lease && h.otherFault(p, r.Time, r.Time) != nil {
				*excused++
				continue
			}
			switch {
			case r.Kind == KindDaemon && (r.Daemon.Msg == diagnostics.MsgLeaseExpired || r.Daemon.Msg == diagnostics.MsgLeaseLost):
				out = append(out, Finding{Property: ReplicaLease, Subject: first(r.AttemptID, subject),
					Detail: fmt.Sprintf("%s wrote %s while replica %s was down (%s)", p.host, r.Daemon.Msg, f.Replica, f.Fault.Kind),
					Lines:  []int{f.Line, r.Line}})
			case r.Kind == KindHTTP && IsAttemptWrite(r.HTTP.Call) && r.HTTP.Code == wire.CodeLeaseLost:
				out = append(out, Finding{Property: ReplicaLease, Subject: first(r.AttemptID, subject),
					Detail: fmt.Sprintf("%s of %s answered lease_lost while replica %s was down (%s)", r.HTTP.Call, p.host, f.Replica, f.Fault.Kind),
					Lines:  []int{f.Line, r.Line}})
			}
		}
	}
	return out
}

// failoverGaps are the renewal gaps of the judged pairs: for every
// attempt of the host whose last committed renewal before the loss went
// through the lost replica, the time from that renewal's answer to the
// answer of its next committed renewal through another replica — unless
// another fault that can delay it touched the host then.
func (h *history) failoverGaps() []time.Duration {
	renews := map[string][]*Record{} // attempt → 2xx renewals, by Answered
	for _, r := range h.writes {
		if r.HTTP.Call == wire.OpRenew && ok2xx(r.HTTP.Status) && r.HTTP.Answered != nil && r.AttemptID != "" {
			renews[r.AttemptID] = append(renews[r.AttemptID], r)
		}
	}
	for _, rs := range renews {
		sort.SliceStable(rs, func(a, b int) bool { return rs[a].HTTP.Answered.Before(*rs[b].HTTP.Answered) })
	}
	var gaps []time.Duration
	for _, p := range h.replicaPairs() {
		start := p.fault.Fault.Start
		for _, rs := range renews {
			if rs[0].Host != p.host {
				continue
			}
			i, _ := slices.BinarySearchFunc(rs, start, func(r *Record, t time.Time) int { return r.HTTP.Answered.Compare(t) })
			if i == 0 || i == len(rs) || rs[i-1].Replica != p.fault.Replica {
				continue // it had not started, it ended before the loss, or it used another replica
			}
			for _, next := range rs[i:] {
				if next.Replica != p.fault.Replica {
					if h.otherFault(p, *rs[i-1].HTTP.Answered, *next.HTTP.Answered) == nil {
						gaps = append(gaps, next.HTTP.Answered.Sub(*rs[i-1].HTTP.Answered))
					}
					break
				}
			}
		}
	}
	slices.Sort(gaps)
	return gaps
}

// sandboxCounts counts the daemons' records of idle sandboxes stopped and
// woken again (S1), for the report: eviction ran under the faults.
func (h *history) sandboxCounts() (evicted, woken int) {
	for i := range h.recs {
		r := &h.recs[i]
		if r.Kind != KindDaemon {
			continue
		}
		switch r.Daemon.Msg {
		case diagnostics.MsgSandboxEvicted:
			evicted++
		case diagnostics.MsgSandboxWoken:
			woken++
		}
	}
	return evicted, woken
}

// finishedOwn reports whether attempt's own terminal report was accepted:
// its job has a "finished" event naming it.
func (h *history) finishedOwn(jobID, attempt string) bool {
	j := h.jobs[jobID]
	if j == nil || attempt == "" {
		return false
	}
	for _, e := range j.events {
		if e.Event.Type == "finished" && first(e.Event.AttemptID, e.AttemptID) == attempt {
			return true
		}
	}
	return false
}
