package controlplane

import (
	"net/http"
	"strconv"

	"github.com/runnerd/runnerd/wire"
)

// auditPageTmpl is Admin → Audit: who did what to which host, conversation or
// token, when, and why, newest first, with GET /v1/admin/audit's filters
// (the same query parameters, judged by the same auditFilter).
var auditPageTmpl = adminPage(`{{define "title"}}Audit{{end}}{{define "content"}}
<h1>Audit</h1>
<form method="get" action="/admin/audit">
<label>Target <input type="text" name="target" value="{{.Target}}" placeholder="host, conversation or token id"></label>
<label>Action <select name="action"><option value="">any</option>{{range .Actions}}<option{{if eq . $.Action}} selected{{end}}>{{.}}</option>{{end}}</select></label>
<button type="submit">Filter</button>
</form>
{{if .Entries}}<table id="audit">
<thead><tr><th>At</th><th>Actor</th><th>Action</th><th>Target</th><th>Reason</th></tr></thead>
<tbody>{{range .Entries}}<tr class="audit-entry">
<td><time datetime="{{iso .At}}">{{stamp .At}}</time></td>
<td class="actor">{{.Actor}}</td>
<td class="action mono">{{.Action}}</td>
<td class="target mono">{{.Target}}</td>
<td class="reason">{{.Reason}}</td>
</tr>{{end}}</tbody>
</table>
{{with .Next}}<p><a id="next" href="{{.}}">Older entries</a></p>{{end}}
{{else}}<p id="no-audit">No admin action is recorded{{if or .Target .Action}} that matches{{end}}.</p>{{end}}
{{end}}`)

// handleAuditPage is GET /admin/audit; a bad filter is a page saying why
// (400), never raw JSON.
func (s *Server) handleAuditPage(w http.ResponseWriter, r *http.Request) {
	const op = "audit_page"
	p, ok := s.page(w, r, op, "audit")
	if !ok {
		return
	}
	f, e := auditFilter(r)
	if e != nil {
		s.refusal(w, r, e, "Bad filter", "/admin/audit")
		return
	}
	want := f.Limit
	f.Limit++ // one more tells whether an older page exists
	rows, err := s.cfg.Store.ListAudit(r.Context(), f)
	if err != nil {
		s.fail(w, r, op, err)
		return
	}
	data := struct {
		page
		Target, Action string
		Actions        []string
		Entries        []wire.AuditEntry
		Next           string
	}{page: p, Target: f.Target, Action: f.Action, Actions: wire.AuditActions}
	if len(rows) > want {
		rows = rows[:want]
		q := r.URL.Query()
		q.Set("cursor", auditCursorPrefix+strconv.FormatInt(rows[want-1].ID, 10))
		data.Next = "/admin/audit?" + q.Encode()
	}
	for _, row := range rows {
		data.Entries = append(data.Entries, wireAudit(row))
	}
	s.render(w, r, auditPageTmpl, op, data)
}
