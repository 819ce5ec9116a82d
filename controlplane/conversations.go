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
// record moves only with a turn that host runs.
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
	for _, id := range req.ConversationIDs {
		if id == "" {
			writeError(w, invalid("conversation_ids must not hold an empty id."))
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
