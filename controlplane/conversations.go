package controlplane

import (
	"net/http"

	"github.com/runnerd/runnerd/wire"
)

// handleConversationStates answers a host's question about the
// conversations it holds sandboxes for: usable, lost, or unknown (never
// created here, or deleted), with the database's cluster identity. The
// host removes the sandbox of a LOST one, and only when the identity is
// the one it pinned (K8); a LOST conversation never becomes usable again
// (R31), so the answer cannot turn stale in the dangerous direction.
// "Unknown" removes nothing: a new or wrong database knows nothing.
// Each answer says whether the conversation's sandbox is recorded on the
// asking host or another: a host removes its own copy of a sandbox
// recorded elsewhere, since turns go only to the recorded host and the
// record moves only with a turn that host runs. The host says too which of
// its sandboxes are stopped or running (S1): that is what the
// conversation's sandbox_state shows.
func (s *Server) handleConversationStates(w http.ResponseWriter, r *http.Request) {
	const op = "conversation_states"
	h, ok := s.host(w, r, op)
	if !ok {
		return
	}
	var req wire.ConversationStatesRequest
	if e := decode(w, r, &req); e != nil {
		writeError(w, e)
		return
	}
	if len(req.ConversationIDs) > wire.MaxConversationIDs {
		writeError(w, invalid("conversation_ids holds %d ids; at most %d per request.", len(req.ConversationIDs), wire.MaxConversationIDs))
		return
	}
	asked := make(map[string]bool, len(req.ConversationIDs))
	for _, id := range req.ConversationIDs {
		if id == "" {
			writeError(w, invalid("conversation_ids must not hold an empty id."))
			return
		}
		asked[id] = true
	}
	for id, st := range req.SandboxStates {
		if !asked[id] || (st != wire.SandboxRunning && st != wire.SandboxStopped) {
			writeError(w, invalid("sandbox_states must name asked conversations, each %q or %q.", wire.SandboxRunning, wire.SandboxStopped))
			return
		}
	}
	cluster, err := s.cfg.Store.ClusterID(r.Context())
	if err != nil {
		s.fail(w, r, op, err)
		return
	}
	// Never guess: conversations the store could not read are not
	// "unknown", or their host would delete usable sandboxes.
	states, err := s.cfg.Store.ConversationStates(r.Context(), req.ConversationIDs)
	if err != nil {
		s.fail(w, r, op, err)
		return
	}
	// What the host says of its sandboxes' states (S1) is recorded for
	// the conversations whose sandbox is recorded on it, when it changed.
	changed := map[string]string{}
	for id, st := range req.SandboxStates {
		if c, ok := states[id]; ok && c.SandboxHostID == h.ID && c.SandboxState != st {
			changed[id] = st
		}
	}
	if err := s.cfg.Store.RecordSandboxStates(r.Context(), h.ID, changed); err != nil {
		s.fail(w, r, op, err)
		return
	}
	out := wire.ConversationStatesResponse{Conversations: make([]wire.ConversationState, 0, len(req.ConversationIDs)), ClusterID: cluster}
	seen := make(map[string]bool, len(req.ConversationIDs))
	for _, id := range req.ConversationIDs {
		if seen[id] {
			continue
		}
		seen[id] = true
		c, ok := states[id]
		if !ok {
			out.Conversations = append(out.Conversations, wire.ConversationState{ID: id, State: wire.ConversationUnknown})
			continue
		}
		st := wire.ConversationState{ID: id, State: c.State, SandboxHost: c.SandboxHost}
		switch {
		case c.SandboxHostID == "":
		case c.SandboxHostID == h.ID:
			st.Sandbox = wire.SandboxThisHost
		default:
			st.Sandbox = wire.SandboxOtherHost
		}
		out.Conversations = append(out.Conversations, st)
	}
	writeJSON(w, http.StatusOK, out)
}
