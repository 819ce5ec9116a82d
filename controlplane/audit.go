package controlplane

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// PathAdminAudit is the admin audit: who did what, when, to
// which host, conversation or token, and why.
const PathAdminAudit = "/v1/admin/audit"

// auditPage is GET /v1/admin/audit's limit when the request names none;
// maxAuditPage bounds the one it names.
const (
	auditPage    = 100
	maxAuditPage = 500
)

// auditParams are the query parameters GET /v1/admin/audit takes; any
// other is refused by name, as GET /v1/jobs refuses one.
var auditParams = []string{"target", "action", "since", "limit", "cursor"}

// auditCursorPrefix marks an audit cursor, otherwise a row id: opaque to
// clients, stable across new rows.
const auditCursorPrefix = "ac"

// handleListAudit answers GET /v1/admin/audit: the rows its filters
// select, newest first, a page at a time.
func (s *Server) handleListAudit(w http.ResponseWriter, r *http.Request) {
	f, e := auditFilter(r)
	if e != nil {
		writeError(w, e)
		return
	}
	want := f.Limit
	f.Limit++ // one more tells whether a next page exists
	rows, err := s.cfg.Store.ListAudit(r.Context(), f)
	if err != nil {
		s.fail(w, r, "list_audit", err)
		return
	}
	out := wire.AuditList{Entries: []wire.AuditEntry{}}
	if len(rows) > want {
		rows = rows[:want]
		out.NextCursor = auditCursorPrefix + strconv.FormatInt(rows[want-1].ID, 10)
	}
	for _, e := range rows {
		out.Entries = append(out.Entries, wireAudit(e))
	}
	writeJSON(w, http.StatusOK, out)
}

func wireAudit(e store.AuditEntry) wire.AuditEntry {
	return wire.AuditEntry{ID: strconv.FormatInt(e.ID, 10), At: e.At, Actor: e.Actor, Action: e.Action, Target: e.Target, Reason: e.Reason}
}

// auditFilter reads GET /v1/admin/audit's query, refusing a bad one by name.
func auditFilter(r *http.Request) (store.AuditFilter, *apiError) {
	q := r.URL.Query()
	for name := range q {
		if !slices.Contains(auditParams, name) {
			return store.AuditFilter{}, invalid("%s is not a filter of GET %s (it takes %s).", name, PathAdminAudit, strings.Join(auditParams, ", "))
		}
	}
	f := store.AuditFilter{Target: q.Get("target"), Action: q.Get("action"), Limit: auditPage}
	if f.Target != "" {
		// A host's name, a conversation's or a token's id: each of the
		// host names' letters.
		if msg := checkHostName(f.Target); msg != "" {
			return f, invalid("target (a host's name, a conversation's or a token's id): %s", msg)
		}
	}
	if f.Action != "" && !slices.Contains(wire.AuditActions, f.Action) {
		return f, invalid("action must be one of %s.", strings.Join(wire.AuditActions, ", "))
	}
	if v := q.Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return f, invalid("since must be a time as in 2026-11-29T20:03:04Z (RFC 3339).")
		}
		f.Since = t
	}
	limit, e := queryInt(r, "limit")
	if e == nil && limit > maxAuditPage {
		e = invalid("limit must be at most %d.", maxAuditPage)
	}
	if e != nil {
		return f, e
	}
	if limit > 0 {
		f.Limit = int(limit)
	}
	if v := q.Get("cursor"); v != "" {
		id, err := strconv.ParseInt(strings.TrimPrefix(v, auditCursorPrefix), 10, 64)
		if !strings.HasPrefix(v, auditCursorPrefix) || err != nil || id <= 0 {
			return f, invalid("cursor must be the next_cursor of an earlier answer.")
		}
		f.Before = id
	}
	return f, nil
}
