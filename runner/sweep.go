package runner

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/wire"
)

// opSweep names the sweep's control request in records.
const opSweep = "conversation_states"

// sandboxLister is what the sweep needs of a backend beyond
// sandbox.Backend: the conversations it holds sandboxes for on this host,
// each with the cluster identity it was created under. sandbox/process
// and sandbox/docker implement it.
type sandboxLister interface {
	Listed(ctx context.Context) ([]sandbox.Listed, error)
}

// sweepLoop removes the retained sandboxes of conversations that will
// never run here again — LOST (R31: never cleared), deleted by their owner
// (S3), or recorded on another host (sweepReason) — once at start, after
// the restart decisions, and every Config.SandboxSweep (issues 6, 7). Only
// a positive tombstone removes (K8): a LOST or deleted answer from the
// cluster the sandbox was created under, as its backend recorded it
// (sandbox.Listed.Cluster), or — for a sandbox that recorded none, made
// by an earlier release — from the cluster this host pinned at first
// contact (cluster.go). So a host moved to a new database sweeps the new
// cluster's sandboxes on its word and never the old cluster's: "unknown"
// removes nothing, and an answer of another cluster than the sandbox's is
// not asked to judge it at all — a control plane on a new, restored or
// wrongly configured database knows nothing of the host's other
// conversations, and its silence is no evidence. Finish removes a sandbox
// when its own report learns the conversation is LOST; the sweep catches
// every other way there: the daemon stopped the turn on lease loss and the
// reaper decided later, a restart found the lease already gone, or any
// other cause. It runs on its own goroutine and holds no lock while it
// waits, so it never delays a claim or a turn.
func (d *Daemon) sweepLoop(ctx context.Context) {
	lister, ok := d.cfg.Backend.(sandboxLister)
	if !ok {
		why := "backend_cannot_list"
		if d.cfg.Backend == nil {
			why = "no_backend"
		}
		d.log.LogAttrs(context.Background(), slog.LevelWarn, MsgSweepOff, slog.String(keyDecision, why))
		return
	}
	s := sweeper{d: d, lister: lister}
	for {
		s.round(ctx)
		t := time.NewTimer(jitter(d.cfg.SandboxSweep, d.cfg.Jitter))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-d.kickSweep: // an eviction: say so now (sandbox_state)
		case <-t.C:
		}
		t.Stop()
	}
}

// kickSweepNow asks the sweep to run a round now.
func (d *Daemon) kickSweepNow() {
	select {
	case d.kickSweep <- struct{}{}:
	default:
	}
}

// sweeper is the sweep's memory between rounds: whether the control plane
// or the listing is failing, or the control plane lacks the call — one
// record for each run of them.
type sweeper struct {
	d           *Daemon
	lister      sandboxLister
	failing     bool
	listFailing bool
	unsupported bool
	// statesRefused: the control plane refused sandbox_states (400
	// unknown_field, older than the field); the sweep asks without them.
	statesRefused bool
	// otherCluster is the last MsgSweepOtherCluster recorded (the
	// answering cluster and how many sandboxes it could not judge), so
	// each is recorded once while it holds.
	otherCluster string
}

// round is one sweep: list, leave out the conversations with a turn on
// this host, ask the control plane, remove each lost one whose sandbox
// that control plane's cluster may judge (judges). A failure ends the
// round; the next one tries again.
func (s *sweeper) round(ctx context.Context) {
	d := s.d
	if d.isHostRefused() {
		return
	}
	lctx, cancel := context.WithTimeout(ctx, d.cfg.ControlTimeout)
	listed, err := s.lister.Listed(lctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil && !s.listFailing {
			s.listFailing = true
			d.log.LogAttrs(context.Background(), slog.LevelWarn, MsgSweepFailed,
				slog.String(diagnostics.KeyOp, "list_sandboxes"), slog.String(diagnostics.KeyClass, diagnostics.Class(err)))
		}
		return
	}
	s.listFailing = false
	d.collectTeardowns(ctx, listed) // S6: what the supervisors could not prove
	var ask []string
	created := make(map[string]string, len(listed)) // conversation → the cluster its sandbox was created under
	for _, l := range listed {
		if !d.turnRunsIn(l.ConversationID) {
			ask = append(ask, l.ConversationID)
			created[l.ConversationID] = l.Cluster
		}
	}
	others := 0 // sandboxes the answering cluster may not judge
	answering := ""
	for len(ask) > 0 && ctx.Err() == nil {
		batch := ask[:min(len(ask), wire.MaxConversationIDs)]
		ask = ask[len(batch):]
		req := wire.ConversationStatesRequest{ConversationIDs: batch}
		if !s.statesRefused {
			req.SandboxStates = d.sandboxStates(batch) // S1: the control plane shows a stopped sandbox
		}
		resp, ok := s.ask(ctx, req)
		if !ok {
			return
		}
		// The host's pin judges the sandboxes that recorded no cluster;
		// asked (and pinned at first contact) only if one of them is here.
		pinned := false
		for _, c := range batch {
			if created[c] == "" {
				pinned = d.trustCluster(resp.ClusterID)
				break
			}
		}
		answering = resp.ClusterID
		asked := make(map[string]bool, len(batch))
		for _, c := range batch {
			asked[c] = true
		}
		for _, st := range resp.Conversations {
			if !asked[st.ID] || ctx.Err() != nil {
				continue
			}
			delete(asked, st.ID) // one answer per id
			if !judges(created[st.ID], resp.ClusterID, pinned) {
				others++
				continue
			}
			// A turn claimed meanwhile keeps its sandbox. (None can be: a
			// LOST or deleted conversation is never claimed, nor one
			// recorded on another host.)
			if why := sweepReason(st, d.turnRunsIn(st.ID)); why != "" {
				s.remove(st, why)
			}
		}
	}
	s.noteOtherCluster(answering, others)
}

// judges reports whether the answer of cluster answering may remove a
// sandbox created under cluster created (K8 per sandbox): only the
// sandbox's own cluster judges it; one that recorded none (an earlier
// release's) is judged under the host's pin, pinned saying whether
// answering is the pinned cluster. A control plane that sends no identity
// judges nothing.
func judges(created, answering string, pinned bool) bool {
	if created == "" {
		return pinned
	}
	return answering != "" && created == answering
}

// noteOtherCluster records, once for each cluster and count, that the
// answering cluster may not judge n of this host's sandboxes: created
// under another cluster, which alone may remove them, or recording none
// while the host pinned another.
func (s *sweeper) noteOtherCluster(answering string, n int) {
	key := ""
	if n > 0 {
		key = answering + " " + strconv.Itoa(n)
	}
	if key == s.otherCluster {
		return
	}
	s.otherCluster = key
	if n > 0 {
		s.d.log.LogAttrs(context.Background(), slog.LevelInfo, MsgSweepOtherCluster,
			slog.String(keySeenCluster, answering), slog.Int(keyKept, n))
	}
}

// Why the sweep removes a sandbox (its records' reason).
const (
	sweptLost              = "lost"
	sweptDeleted           = "deleted"
	sweptRecordedElsewhere = "recorded_elsewhere"
)

// sweepReason says why the sweep removes the local sandbox of the
// conversation its own cluster (judges) answered st for, or "" to keep it. Only
// positive evidence removes (K8): LOST (R31: never usable again), deleted
// by its owner (S3: it takes no message again, and a deleted conversation
// is never usable again either), or the
// conversation's sandbox recorded on another host — an attempt here
// started this one and ended before it recorded it (issue foreign
// sandbox). Turns go only to the recorded host, and the record moves only
// with a turn that host runs, so this host runs no turn of it again.
// "Unknown", nothing recorded yet (another host's attempt may be about to
// record, or this host's next one), recorded here, or a turn held here:
// kept.
func sweepReason(st wire.ConversationState, turnHere bool) string {
	switch {
	case turnHere || st.State == wire.ConversationUnknown:
		return ""
	case st.State == wire.ConversationLost:
		return sweptLost
	case st.State == wire.ConversationDeleted:
		return sweptDeleted
	case st.Sandbox == wire.SandboxOtherHost:
		return sweptRecordedElsewhere
	}
	return ""
}

// ask asks the control plane about one batch; false ends the round.
func (s *sweeper) ask(ctx context.Context, req wire.ConversationStatesRequest) (wire.ConversationStatesResponse, bool) {
	d := s.d
	rctx, cancel := context.WithTimeout(ctx, d.cfg.ControlTimeout)
	resp, err := d.control.ConversationStates(rctx, d.hostToken(), req)
	cancel()
	status := diagnostics.Status(err)
	var se *wire.StatusError
	switch {
	case err != nil && len(req.SandboxStates) > 0 && errors.As(err, &se) && se.Code == wire.CodeUnknownField:
		// A control plane older than sandbox_states: ask without them
		// from now on (it shows no stopped sandbox).
		s.statesRefused = true
		req.SandboxStates = nil
		return s.ask(ctx, req)
	case err == nil:
		if s.failing || s.unsupported {
			s.failing, s.unsupported = false, false
			d.log.LogAttrs(context.Background(), slog.LevelInfo, MsgControlRecovered, slog.String(diagnostics.KeyOp, opSweep))
		}
		return resp, true
	case ctx.Err() != nil:
	case status == http.StatusNotFound:
		// A control plane older than the call: remove nothing and say so
		// once; ask again next round, so that an upgrade needs no restart.
		if !s.unsupported {
			s.unsupported = true
			d.log.LogAttrs(context.Background(), slog.LevelWarn, MsgSweepOff,
				slog.String(keyDecision, "control_plane_unsupported"), slog.Int(diagnostics.KeyStatus, status))
		}
	case wire.Classify(err) == wire.CredentialRefused: // 401, 403 (404 is above)
		d.refuseHost(opSweep, status)
	case !s.failing:
		s.failing = true
		d.rec.ControlFailure(context.Background(), opSweep, diagnostics.Attempt{}, err)
	}
	return wire.ConversationStatesResponse{}, false
}

// remove removes one conversation's sandbox, with one record either way.
func (s *sweeper) remove(st wire.ConversationState, why string) {
	d := s.d
	ctx, cancel := context.WithTimeout(context.Background(), d.teardownBound())
	defer cancel()
	attrs := []slog.Attr{slog.String(keyConversation, st.ID), slog.String(keyConvState, st.State), slog.String(keyReason, why)}
	if why == sweptRecordedElsewhere {
		attrs = append(attrs, slog.String(keySandboxHost, st.SandboxHost))
	}
	began := time.Now()
	err := d.cfg.Backend.Remove(ctx, st.ID)
	if d.teardownEnded(teardownDelete, st.ID, began, err) {
		return // not proven: the record names what survived; a container still there is swept again
	}
	if err != nil {
		d.log.LogAttrs(context.Background(), slog.LevelWarn, MsgSandboxKept,
			append(attrs, slog.String(keyDecision, "sweep"), slog.String(diagnostics.KeyClass, diagnostics.Class(err)))...)
		return
	}
	d.log.LogAttrs(context.Background(), slog.LevelInfo, MsgSandboxSwept, append(attrs, slog.String(keyBackend, d.cfg.Backend.Name()))...)
}

// ---- conversations with a turn on this host ----

// holdConversation marks a turn of conv as held by this daemon, from its
// claim until its attempt is over; the sweep leaves its sandbox alone.
// It also ends the conversation's idle clock (idle.go): a held
// conversation's sandbox is never evicted, and one that was is woken by
// this turn's Ensure, with a record.
func (d *Daemon) holdConversation(conv string) {
	d.mu.Lock()
	d.turnConvs[conv]++
	stoppedFor, woken := d.wakeNotedLocked(conv)
	d.mu.Unlock()
	if woken {
		d.log.LogAttrs(context.Background(), slog.LevelInfo, diagnostics.MsgSandboxWoken,
			slog.String(keyConversation, conv), slog.String(keyBackend, d.cfg.Backend.Name()),
			slog.Int64(diagnostics.KeyStoppedFor, stoppedFor.Milliseconds()))
	}
}

// releaseConversation ends a hold; the last one starts the conversation's
// idle clock when idle eviction is on.
func (d *Daemon) releaseConversation(conv string) {
	d.mu.Lock()
	if d.turnConvs[conv]--; d.turnConvs[conv] <= 0 {
		delete(d.turnConvs, conv)
		if d.idle != nil {
			d.idle[conv] = &sandboxIdle{phase: sandboxRetained, since: time.Now()}
		}
	}
	d.mu.Unlock()
}

func (d *Daemon) turnRunsIn(conv string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.turnConvs[conv] > 0
}
