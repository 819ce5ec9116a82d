package controlplane

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
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

// maxJobPage bounds the limit of GET /v1/jobs.
const maxJobPage = 500

// jobListParams are the query parameters GET /v1/jobs takes; any other is
// refused by name, so that a misspelt filter is not a silent "all jobs".
var jobListParams = []string{"state", "outcome", "class", "host", "conversation", "since", "limit", "cursor"}

// jobFilterOf reads the jobs filter of r's query, as GET /v1/jobs and
// Admin → Jobs (endpoint names which, in the refusal) take it, or the
// refusal naming the wrong parameter.
func jobFilterOf(r *http.Request, endpoint string) (store.JobFilter, *apiError) {
	q := r.URL.Query()
	for name := range q {
		if !slices.Contains(jobListParams, name) {
			return store.JobFilter{}, invalid("%s is not a filter of %s (it takes %s).", name, endpoint, strings.Join(jobListParams, ", "))
		}
	}
	f := store.JobFilter{State: q.Get("state"), Outcome: q.Get("outcome"), Class: q.Get("class"),
		Host: q.Get("host"), ConversationID: q.Get("conversation")}
	if f.State != "" && !slices.Contains(jobStates, f.State) {
		return store.JobFilter{}, invalid("state must be one of %s.", strings.Join(jobStates, ", "))
	}
	if f.Outcome != "" && !slices.Contains(jobOutcomes, f.Outcome) {
		return store.JobFilter{}, invalid("outcome must be one of %s.", strings.Join(jobOutcomes, ", "))
	}
	if f.Class != "" && !classRE.MatchString(f.Class) {
		return store.JobFilter{}, invalid("class is an error class: letters, digits and _.")
	}
	if v := q.Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return store.JobFilter{}, invalid("since must be a time as in 2026-11-29T20:03:04Z (RFC 3339).")
		}
		f.Since = t
	}
	limit, e := queryInt(r, "limit")
	if e == nil && limit > maxJobPage {
		e = invalid("limit must be at most %d.", maxJobPage)
	}
	if e != nil {
		return store.JobFilter{}, e
	}
	f.Limit = int(limit)
	if v := q.Get("cursor"); v != "" {
		pos, err := strconv.ParseInt(strings.TrimPrefix(v, cursorPrefix), 10, 64)
		if !strings.HasPrefix(v, cursorPrefix) || err != nil || pos <= 0 {
			return store.JobFilter{}, invalid("cursor must be the next_cursor of an earlier answer.")
		}
		f.Before = pos
	}
	return f, nil
}

// jobOutcomes are the outcomes the jobs filter takes.
var jobOutcomes = []string{wire.OutcomeSucceeded, wire.OutcomeFailed, wire.OutcomeCancelled}

// handleListJobs answers GET /v1/jobs: the jobs its filters select, newest
// first, a page at a time; the cursor is a queue position, so a job
// queued meanwhile does not shift the pages after the first.
func (s *Server) handleListJobs(w http.ResponseWriter, r *http.Request) {
	f, e := jobFilterOf(r, "GET /v1/jobs")
	if e != nil {
		writeError(w, e)
		return
	}
	l, err := s.cfg.Store.ListJobs(r.Context(), f)
	if err != nil {
		s.fail(w, r, "list_jobs", err)
		return
	}
	out := wire.JobList{Jobs: l.Jobs}
	if out.Jobs == nil {
		out.Jobs = []wire.Job{}
	}
	if l.Next > 0 {
		out.NextCursor = cursorPrefix + strconv.FormatInt(l.Next, 10)
	}
	writeJSON(w, http.StatusOK, out)
}

// cursorPrefix marks a GET /v1/jobs cursor, which is otherwise a queue
// position: opaque to clients, stable across new jobs.
const cursorPrefix = "jc"

// classRE is an error class as runners name them.
var classRE = regexp.MustCompile(`^[A-Za-z0-9_]+$`)

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

// handlePermit records the owner's answer to a pending ACP permission
// request of the job's running turn; the turn child's long poll
// (handlePermissionAnswer) carries it to the agent.
func (s *Server) handlePermit(w http.ResponseWriter, r *http.Request) {
	const op = "permit"
	// option_id decoded on its own: a value of another type is the
	// field's mistake (400 invalid naming it), not unreadable JSON.
	var body struct {
		OptionID json.RawMessage `json:"option_id"`
	}
	if e := decode(w, r, &body, "option_id"); e != nil {
		writeError(w, e)
		return
	}
	var req wire.PermissionAnswer
	if json.Unmarshal(body.OptionID, &req.OptionID) != nil || req.OptionID == "" {
		writeError(w, invalid("option_id must be a string naming one of the request's options."))
		return
	}
	now, ok := s.now(w, r, op)
	if !ok {
		return
	}
	id := r.PathValue("id")
	if err := s.cfg.Store.AnswerPermission(r.Context(), id, r.PathValue("request"), req.OptionID, now); err != nil {
		s.fail(w, r, op, err)
		return
	}
	j, err := s.cfg.Store.GetJob(r.Context(), id)
	if err != nil {
		s.fail(w, r, op, err)
		return
	}
	writeJSON(w, http.StatusOK, j)
}
