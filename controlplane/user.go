package controlplane

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/runnerd/runnerd/wire"
)

// eventPage bounds the events of one answer of GET /v1/jobs/{id}/events.
const eventPage = 500

func (s *Server) handleCreateConversation(w http.ResponseWriter, r *http.Request) {
	var req wire.CreateConversationRequest
	if e := decode(w, r, &req); e != nil {
		writeError(w, e)
		return
	}
	if len(req.AgentCommand) == 0 || req.AgentCommand[0] == "" {
		writeError(w, invalid("agent_command needs at least the program to run."))
		return
	}
	now, ok := s.now(w, r, "create_conversation")
	if !ok {
		return
	}
	c, err := s.cfg.Store.CreateConversation(r.Context(), req, now)
	if err != nil {
		s.fail(w, r, "create_conversation", err)
		return
	}
	writeJSON(w, http.StatusCreated, c)
}

func (s *Server) handleListConversations(w http.ResponseWriter, r *http.Request) {
	cs, err := s.cfg.Store.ListConversations(r.Context())
	if err != nil {
		s.fail(w, r, "list_conversations", err)
		return
	}
	if cs == nil {
		cs = []wire.Conversation{}
	}
	writeJSON(w, http.StatusOK, wire.ConversationList{Conversations: cs})
}

func (s *Server) handleGetConversation(w http.ResponseWriter, r *http.Request) {
	c, err := s.cfg.Store.GetConversation(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, "get_conversation", err)
		return
	}
	writeJSON(w, http.StatusOK, c)
}

// handleSendMessage enqueues a turn. A LOST conversation refuses it in
// plain words (R32), a deleted one with 410 (S3); the store decides that,
// in the same statement.
func (s *Server) handleSendMessage(w http.ResponseWriter, r *http.Request) {
	var req wire.SendMessageRequest
	if e := decode(w, r, &req); e != nil {
		writeError(w, e)
		return
	}
	if req.Prompt == "" {
		writeError(w, invalid("prompt must not be empty."))
		return
	}
	now, ok := s.now(w, r, "send_message")
	if !ok {
		return
	}
	j, err := s.cfg.Store.EnqueueTurn(r.Context(), r.PathValue("id"), req.Prompt, now)
	if err != nil {
		s.fail(w, r, "send_message", err)
		return
	}
	writeJSON(w, http.StatusCreated, j)
}

// handleDeleteConversation deletes a conversation on its owner's word
// (S3). The store refuses while a turn of it runs or waits; the host that
// holds its sandbox removes the sandbox when its sweep asks about it and
// this cluster answers deleted (K8).
func (s *Server) handleDeleteConversation(w http.ResponseWriter, r *http.Request) {
	const op = "delete_conversation"
	now, ok := s.now(w, r, op)
	if !ok {
		return
	}
	c, err := s.cfg.Store.DeleteConversation(r.Context(), r.PathValue("id"), now)
	if err != nil {
		s.fail(w, r, op, err)
		return
	}
	s.log.LogAttrs(r.Context(), slog.LevelInfo, MsgConversationDeleted, slog.String("conversation_id", c.ID))
	writeJSON(w, http.StatusOK, c)
}

func (s *Server) handleGetJob(w http.ResponseWriter, r *http.Request) {
	j, err := s.cfg.Store.GetJob(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, "get_job", err)
		return
	}
	writeJSON(w, http.StatusOK, j)
}

func jobEnded(state string) bool {
	return state == wire.JobSucceeded || state == wire.JobFailed || state == wire.JobCancelled
}

// handleJobEvents follows a job's events: those after the cursor, held up
// to wait_ms (capped by ClaimWaitMax) until there is one or the job ends.
func (s *Server) handleJobEvents(w http.ResponseWriter, r *http.Request) {
	const op = "job_events"
	id := r.PathValue("id")
	after, e := queryInt(r, "after")
	if e != nil {
		writeError(w, e)
		return
	}
	waitMS, e := queryInt(r, "wait_ms")
	if e != nil {
		writeError(w, e)
		return
	}
	var out wire.JobEventList
	_, err := poll(r.Context(), s.longPoll(waitMS), func(ctx context.Context) (bool, error) {
		// The state is read before the events: a job that had ended
		// before this read has all its events below.
		j, err := s.cfg.Store.GetJob(ctx, id)
		if err != nil {
			return false, err
		}
		ev, err := s.cfg.Store.JobEvents(ctx, id, after, eventPage)
		if err != nil {
			return false, err
		}
		out = wire.JobEventList{Events: ev, Ended: jobEnded(j.State) && len(ev) < eventPage}
		return len(ev) > 0 || out.Ended, nil
	})
	if err != nil {
		s.fail(w, r, op, err)
		return
	}
	if out.Events == nil {
		out.Events = []wire.JobEvent{}
	}
	writeJSON(w, http.StatusOK, out)
}

func queryInt(r *http.Request, name string) (int64, *apiError) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, invalid("%s must be a whole number, 0 or more.", name)
	}
	return n, nil
}

// handleCancelJob ends a queued job at once, or sets the cancel flag that
// the running attempt's next renewal answer carries (P7).
func (s *Server) handleCancelJob(w http.ResponseWriter, r *http.Request) {
	now, ok := s.now(w, r, "cancel_job")
	if !ok {
		return
	}
	j, err := s.cfg.Store.CancelJob(r.Context(), r.PathValue("id"), now)
	if err != nil {
		s.fail(w, r, "cancel_job", err)
		return
	}
	writeJSON(w, http.StatusOK, j)
}
