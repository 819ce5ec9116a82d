package controlplane

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// The admin pages: Servers, Jobs, one job's timeline and Conversations,
// rendered on the server (html/template), refreshed by the browser every
// AdminRefresh, with no script at all (the Content-Security-Policy allows
// none). Their forms post to /admin/... routes that check a CSRF token
// (adminForm) besides the cross-origin check every user-API change gets.

// AdminRefresh is how often an admin page reloads itself.
const AdminRefresh = 10 * time.Second

// eventStaleReport is the store's event of a write refused after its
// attempt's lease was lost (P1), which the job page counts and marks.
const eventStaleReport = "lease.stale_report"

func (s *Server) servers(w http.ResponseWriter, r *http.Request) ([]wire.Server, bool) {
	list, err := s.cfg.Store.ListServers(r.Context())
	if err != nil {
		s.fail(w, r, "list_servers", err)
		return nil, false
	}
	if list == nil {
		list = []wire.Server{}
	}
	// A host's state is judged on the store's clock, which wrote its last
	// heartbeat (K3).
	now, ok := s.now(w, r, "list_servers")
	if !ok {
		return nil, false
	}
	for i := range list {
		sv := &list[i]
		sv.State = wire.HostState(*sv, now)
		if c := sv.Conflict; c != nil && now.Sub(c.LastSeen) > sv.OfflineAfter() {
			sv.Conflict = nil // refused long enough ago that it is no longer heard
		}
	}
	return list, true
}

func (s *Server) handleServersJSON(w http.ResponseWriter, r *http.Request) {
	if list, ok := s.servers(w, r); ok {
		writeJSON(w, http.StatusOK, wire.ServerList{Servers: list})
	}
}

// csrfField is the name of the CSRF token in an admin form.
const csrfField = "csrf"

// csrfToken is the token the admin forms carry: an HMAC-SHA256 of a fixed
// label keyed by the request's own user token. Only a holder of the token
// can make it; another site's page cannot read it off ours (same-origin
// policy); and every replica computes the same one with no session state.
func csrfToken(r *http.Request) string {
	tok, _ := credential(r)
	m := hmac.New(sha256.New, []byte(tok))
	m.Write([]byte("runnerd admin form v1"))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// errBadCSRF refuses an admin form without this page's CSRF token.
var errBadCSRF = refuse(http.StatusForbidden, wire.CodeForbidden,
	"This form was not sent from the control plane's own page; reload the page and try again.")

// adminForm wraps the handler of an admin page's form: the user token
// (Basic credentials allowed, as from the browser that shows the page),
// the cross-origin check, and the form's CSRF token, compared in constant
// time. The form is at most a few fields; its body is capped.
func (s *Server) adminForm(h http.HandlerFunc) http.HandlerFunc {
	return s.userAuth(true, func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 4096)
		got := r.PostFormValue(csrfField)
		if got == "" || !hmac.Equal([]byte(got), []byte(csrfToken(r))) {
			writeError(w, errBadCSRF)
			return
		}
		h(w, r)
	})
}

// adminFuncs are the helpers every admin template may call.
var adminFuncs = template.FuncMap{
	"ago": func(now time.Time, t *time.Time) string {
		if t == nil {
			return "never"
		}
		return now.Sub(*t).Truncate(time.Second).String() + " ago"
	},
	"stamp":  func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000Z") },
	"iso":    func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) },
	"until":  func(now, t time.Time) string { return t.Sub(now).Truncate(time.Second).String() },
	"before": func(a, b time.Time) bool { return a.Before(b) },
	"lastOwner": func(j wire.Job) string {
		if len(j.Attempts) == 0 {
			return ""
		}
		return j.Attempts[len(j.Attempts)-1].LeaseOwner
	},
	"offlineAfter": func(sv wire.Server) string {
		return (wire.OfflineAfterIntervals * heartbeatInterval(sv)).String() + " or more"
	},
	"jobEnded": func(state string) bool { return state != wire.JobQueued && state != wire.JobRunning },
}

// adminLayout is the frame of every page: title, refresh, navigation.
const adminLayout = `{{define "page"}}<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="refresh" content="{{.Refresh}}">
<title>{{template "title" .}} · runnerd control plane</title>
<style>
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em 2em; color: #222; }
nav { margin-bottom: 1em; }
nav a { margin-right: 1.2em; }
nav a.here { font-weight: 700; text-decoration: none; color: #222; }
table { border-collapse: collapse; margin-bottom: 1.2em; }
th, td { text-align: left; padding: .3em .8em; border-bottom: 1px solid #ddd; vertical-align: top; }
th { background: #f4f4f4; }
td.num { text-align: right; }
td:first-child, time { white-space: nowrap; }
code, .mono { font-family: ui-monospace, monospace; font-size: 13px; }
.launch-error, .stale, .lost, .unroutable { color: #a40000; font-weight: 600; }
.quarantined { color: #8a5a00; font-weight: 600; }
.draining, .paused, .sandbox-pressure { color: #8a5a00; font-weight: 600; }
.offline { color: #a40000; font-weight: 600; }
.online, .usable { color: #17632a; font-weight: 600; }
tr.stale td { background: #fff0f0; }
.note { color: #555; }
.attempt { border: 1px solid #ccc; border-radius: 4px; padding: .2em 1em .5em; margin-bottom: 1em; }
form.inline { display: inline; margin: 0; }
button { font: inherit; cursor: pointer; white-space: nowrap; }
</style>
</head>
<body>
<nav>
<a href="/admin/servers"{{if eq .Nav "servers"}} class="here"{{end}}>Servers</a>
<a href="/admin/jobs"{{if eq .Nav "jobs"}} class="here"{{end}}>Jobs</a>
<a href="/admin/conversations"{{if eq .Nav "conversations"}} class="here"{{end}}>Conversations</a>
<a href="/admin/audit"{{if eq .Nav "audit"}} class="here"{{end}}>Audit</a>
</nav>
{{template "content" .}}
<p class="note">As of <time datetime="{{iso .Now}}">{{stamp .Now}}</time> on the store's clock{{with .Skew}}; this replica's own clock is {{.}} off the store's, on which leases are judged{{end}}; this page reloads every {{.Refresh}} s.</p>
</body>
</html>
{{end}}`

// adminPage parses one page's "title" and "content" into the layout.
func adminPage(body string) *template.Template {
	t := template.Must(template.New("").Funcs(adminFuncs).Parse(adminLayout))
	return template.Must(t.Parse(body))
}

// page is what every admin page's data starts with. Now is the store's
// clock, on which leases are judged (K3).
type page struct {
	Nav     string
	Now     time.Time
	Skew    time.Duration // this replica's own clock minus the store's
	Refresh int
	CSRF    string
}

func (s *Server) page(w http.ResponseWriter, r *http.Request, op, nav string) (page, bool) {
	now, ok := s.now(w, r, op)
	if !ok {
		return page{}, false
	}
	return page{Nav: nav, Now: now, Skew: s.cfg.Now().Sub(now).Round(time.Second),
		Refresh: int(AdminRefresh / time.Second), CSRF: csrfToken(r)}, true
}

// render writes a page: no caching, no sniffing, no script, not framable,
// and forms may post to this origin only.
func (s *Server) render(w http.ResponseWriter, r *http.Request, t *template.Template, op string, data any) {
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "page", data); err != nil {
		s.fail(w, r, op, err)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'")
	h.Set("Referrer-Policy", "same-origin")
	_, _ = w.Write(buf.Bytes())
}

// serversPage is Admin → Servers: every host with its last heartbeat,
// capacity, running turns, draining state and, beside it, the launch
// error that stopped its claims (R37).
var serversPage = adminPage(`{{define "title"}}Servers{{end}}{{define "content"}}
<h1>Servers</h1>
<p>{{len .Servers}} host(s).</p>
{{if .Servers}}
<table id="servers">
<thead><tr><th>Host</th><th>State</th><th>Labels</th><th>Last heartbeat</th><th>Running / capacity</th><th>Launch error</th><th>Version</th><th>Jobs</th><th></th></tr></thead>
<tbody>
{{range .Servers}}{{$state := .State}}{{$sv := .}}<tr data-host="{{.Name}}">
<td>{{.Name}}</td>
<td class="host-state"><span class="{{.State}}">{{.State}}</span>{{if eq .State "offline"}}: no heartbeat for {{offlineAfter .}}{{end}}{{with .PausedAt}}{{if eq $state "paused"}} since{{else}}<br><span class="paused">paused since</span>{{end}} <time datetime="{{iso .}}">{{stamp .}}</time>{{end}}{{if .PausedAt}}{{with .PausedBy}} <span class="paused-by">by {{.}}</span>{{end}}{{with .PauseReason}}: <span class="pause-reason">{{.}}</span>{{end}}{{end}}{{if .Draining}}{{if ne .State "draining"}}<br>last said draining{{end}}{{end}}{{with .ClaimsWithheld}}<br><span class="paused">claims withheld: {{.}}</span>{{end}}{{with .Conflict}}<br><span class="host-conflict offline">conflict: two daemons present this host's token.{{with $sv.Instance}}
live: instance <code>{{.ID}}</code> boot <code>{{.BootID}}</code>, seen <time datetime="{{iso .LastSeen}}">{{stamp .LastSeen}}</time>;{{end}}
refused host_token_in_use: instance <code>{{.ID}}</code> boot <code>{{.BootID}}</code>, seen <time datetime="{{iso .LastSeen}}">{{stamp .LastSeen}}</time></span>{{end}}</td>
<td class="labels">{{range $k, $v := .Labels}}<code class="label">{{$k}}={{$v}}</code> {{else}}none{{end}}</td>
<td>{{if .LastHeartbeat}}<time datetime="{{iso .LastHeartbeat}}">{{ago $.Now .LastHeartbeat}}</time>{{else}}never{{end}}</td>
<td class="num">{{.Running}} / {{.Capacity}}</td>
<td>{{with .LaunchError}}<span class="launch-error">{{.Class}}: {{.Consecutive}} consecutive launch failure(s) since <time datetime="{{iso .Since}}">{{stamp .Since}}</time>; claims paused</span>{{else}}none{{end}}{{with .SandboxPressure}}<br><span class="sandbox-pressure">sandbox_pressure: {{.Resource}} {{.FreeBytes}} of {{.TotalBytes}} bytes free (at least {{.MinFreeBytes}} wanted) since <time datetime="{{iso .Since}}">{{stamp .Since}}</time>; first turns withheld, its conversations' turns still run</span>{{end}}</td>
<td>{{.Version}}</td>
<td><a href="/admin/jobs?host={{.Name}}">jobs</a></td>
<td><form class="inline" method="post" action="/admin/servers/{{.Name}}/{{if .PausedAt}}resume{{else}}pause{{end}}">
<input type="hidden" name="csrf" value="{{$.CSRF}}">
{{if not .PausedAt}}<input type="text" name="reason" maxlength="1024" placeholder="reason" aria-label="reason for the pause">{{end}}
<button type="submit" class="host-action">{{if .PausedAt}}Resume{{else}}Pause{{end}}</button>
</form></td>
</tr>
{{end}}</tbody>
</table>
<p class="note">A host is offline once {{.OfflineAfter}} of its heartbeat intervals pass without one. Pause: the host is given no new turn while its running turns go on; Resume gives it turns again.</p>
{{else}}
<p>No host is registered. Add one with <code>controlplane host add NAME</code>.</p>
{{end}}{{end}}`)

func (s *Server) handleServersPage(w http.ResponseWriter, r *http.Request) {
	p, ok := s.page(w, r, "servers_page", "servers")
	if !ok {
		return
	}
	list, ok := s.servers(w, r)
	if !ok {
		return
	}
	s.render(w, r, serversPage, "servers_page", struct {
		page
		Servers      []wire.Server
		OfflineAfter int
	}{p, list, wire.OfflineAfterIntervals})
}

// heartbeatInterval is the period sv said it heartbeats at, or the default
// wire.HostState assumes.
func heartbeatInterval(sv wire.Server) time.Duration {
	if sv.HeartbeatIntervalMS > 0 {
		return time.Duration(sv.HeartbeatIntervalMS) * time.Millisecond
	}
	return wire.DefaultHeartbeatInterval
}

// handleHostForm is Admin → Servers' Pause or Resume button (the admin
// API's POST /v1/admin/hosts/{name}/pause|resume).
func (s *Server) handleHostForm(pause bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		now, ok := s.now(w, r, "host_form")
		if !ok {
			return
		}
		name := r.PathValue("name")
		reason := r.PostFormValue("reason")
		if e := checkReason(reason, false); e != nil {
			s.formDone(w, r, "host_form", "/admin/servers", e)
			return
		}
		err := s.cfg.Store.PauseHost(r.Context(), name, pause, audit(r, reason), now)
		if err == nil {
			action := "resume"
			if pause {
				action = "pause"
			}
			s.log.LogAttrs(r.Context(), slog.LevelInfo, MsgHostChanged, slog.String("host", name), slog.String("action", action))
		}
		s.formDone(w, r, "host_form", "/admin/servers", err)
	}
}

// jobStates are the states Admin → Jobs filters by.
var jobStates = []string{wire.JobQueued, wire.JobRunning, wire.JobSucceeded, wire.JobFailed, wire.JobCancelled}

// jobsPage is Admin → Jobs, newest first, filtered by state, conversation
// and the host that held a lease of the job.
var jobsPage = adminPage(`{{define "title"}}Jobs{{end}}{{define "content"}}
<h1>Jobs</h1>
<form method="get" action="/admin/jobs">
<label>State <select name="state"><option value="">any</option>{{range .States}}<option{{if eq . $.Filter.State}} selected{{end}}>{{.}}</option>{{end}}</select></label>
<label>Conversation <input name="conversation" value="{{.Filter.ConversationID}}" size="32"></label>
<label>Host <input name="host" value="{{.Filter.Host}}" size="16"></label>
<button type="submit">Filter</button> <a href="/admin/jobs">clear</a>
</form>
<p>{{len .Jobs}} job(s), newest first{{if eq (len .Jobs) .Limit}} (the newest {{.Limit}} only){{end}}.</p>
{{if .Jobs}}
<table id="jobs">
<thead><tr><th>Job</th><th>Conversation</th><th>Turn</th><th>State</th><th>Attempts</th><th>Last lease owner</th><th>Created</th><th>Ended</th><th>Reason</th></tr></thead>
<tbody>
{{range .Jobs}}<tr data-job="{{.ID}}">
<td><a class="mono" href="/admin/jobs/{{.ID}}">{{.ID}}</a></td>
<td><a class="mono" href="/admin/jobs?conversation={{.ConversationID}}">{{.ConversationID}}</a></td>
<td class="num">{{.Seq}}</td>
<td class="state">{{.State}}{{if .CancelRequested}} (cancel requested){{end}}{{with .Unroutable}} <span class="unroutable">unroutable{{with .Missing}}: needs {{range $i, $m := .}}{{if $i}}, {{end}}{{$m}}{{end}}{{end}}</span>{{end}}</td>
<td class="num">{{len .Attempts}}</td>
<td>{{with lastOwner .}}<a href="/admin/jobs?host={{.}}">{{.}}</a>{{end}}</td>
<td>{{stamp .CreatedAt}}</td>
<td>{{with .EndedAt}}{{stamp .}}{{end}}</td>
<td>{{.Reason}}</td>
</tr>
{{end}}</tbody>
</table>
{{end}}{{end}}`)

func (s *Server) handleJobsPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := store.JobFilter{State: q.Get("state"), ConversationID: q.Get("conversation"), Host: q.Get("host")}
	if f.State != "" && !slices.Contains(jobStates, f.State) {
		writeError(w, invalid("state must be one of %v.", jobStates))
		return
	}
	p, ok := s.page(w, r, "jobs_page", "jobs")
	if !ok {
		return
	}
	list, err := s.cfg.Store.ListJobs(r.Context(), f)
	if err != nil {
		s.fail(w, r, "list_jobs", err)
		return
	}
	s.render(w, r, jobsPage, "jobs_page", struct {
		page
		Filter store.JobFilter
		States []string
		Jobs   []wire.Job
		Limit  int
	}{p, f, jobStates, list.Jobs, store.DefaultJobListLimit})
}

// attemptView is one attempt on the job page with the events it wrote or
// that were written about it.
type attemptView struct {
	wire.Attempt
	Events []wire.JobEvent
	Stale  int // lease.stale_report events: writes refused after its lease was lost
	// Next is the attempt after it, named only when that attempt's own
	// events exist (R20): a superseded attempt does not by itself mean
	// another one ran.
	Next *wire.Attempt
}

// jobView is one job's page: its attempts in generation order, and every
// event in order with the generation of its attempt, for correlation
// with the runner's and the control plane's logs (R19).
type jobView struct {
	page
	Job      wire.Job
	Attempts []attemptView
	Events   []eventView
}

type eventView struct {
	wire.JobEvent
	Generation int64 // 0 for an event of the job, not of an attempt
	Stale      bool
}

func newJobView(p page, j wire.Job) jobView {
	v := jobView{page: p, Job: j}
	gen := map[string]int64{}
	byAttempt := map[string][]wire.JobEvent{}
	for _, a := range j.Attempts {
		gen[a.ID] = a.Generation
	}
	for _, e := range j.Events {
		byAttempt[e.AttemptID] = append(byAttempt[e.AttemptID], e)
		v.Events = append(v.Events, eventView{JobEvent: e, Generation: gen[e.AttemptID], Stale: e.Type == eventStaleReport})
	}
	for i, a := range j.Attempts {
		av := attemptView{Attempt: a, Events: byAttempt[a.ID]}
		for _, e := range av.Events {
			if e.Type == eventStaleReport {
				av.Stale++
			}
		}
		if i+1 < len(j.Attempts) && len(byAttempt[j.Attempts[i+1].ID]) > 0 {
			av.Next = &j.Attempts[i+1]
		}
		v.Attempts = append(v.Attempts, av)
	}
	return v
}

var jobPage = adminPage(`{{define "title"}}Job {{.Job.ID}}{{end}}{{define "content"}}
{{with .Job}}
<h1>Job <span class="mono">{{.ID}}</span></h1>
<table id="job">
<tr><th>Conversation</th><td><a class="mono" href="/admin/jobs?conversation={{.ConversationID}}">{{.ConversationID}}</a>, turn {{.Seq}}</td></tr>
<tr><th>State</th><td class="state">{{.State}}{{with .Outcome}} ({{.}}){{end}}{{if .CancelRequested}}, cancel requested{{end}}</td></tr>
{{with .Reason}}<tr><th>Reason</th><td>{{.}}</td></tr>{{end}}
{{with .Cause}}<tr><th>Cause</th><td class="cause"><code>{{.}}</code>{{with $.Job.CauseEvidence}}: {{.}}{{end}}</td></tr>{{end}}
<tr><th>Admitted</th><td>{{if .Admitted}}yes: the prompt was handed to the agent{{else}}no{{end}}</td></tr>
<tr><th>Counts</th><td>{{.AttemptCount}} counted attempt(s), {{.WorkerLostCount}} host loss(es), {{.ReleaseCount}} release(s){{with .ReleaseClass}} (last: {{.}}){{end}}</td></tr>
{{with .NotBefore}}<tr><th>Not before</th><td>{{stamp .}} (release backoff)</td></tr>{{end}}
{{with .Unroutable}}<tr><th>Unroutable</th><td class="unroutable">no live host can take this turn{{if .Missing}}: missing {{range $i, $m := .Missing}}{{if $i}}, {{end}}<code>{{$m}}</code>{{end}}{{else}}: no host is online{{end}}, since {{stamp .Since}}. It stays queued until a host that has these labels heartbeats.</td></tr>{{end}}
<tr><th>Created</th><td>{{stamp .CreatedAt}}</td></tr>
{{with .EndedAt}}<tr><th>Ended</th><td>{{stamp .}}</td></tr>{{end}}
{{with .DetailReclaimedAt}}<tr><th>Detail reclaimed</th><td>{{stamp .}}: the prompt, the runner's report and event data are gone; the timeline stays</td></tr>{{end}}
</table>
{{if and (not (jobEnded .State)) (not .CancelRequested)}}
<form method="post" action="/admin/jobs/{{.ID}}/cancel">
<input type="hidden" name="csrf" value="{{$.CSRF}}">
<button type="submit" id="cancel">Cancel this job</button>
<span class="note">A queued job ends at once; a running one is stopped by its host at the next renewal.</span>
</form>
{{end}}
{{if .PendingPermissions}}
<h2>Permission requests waiting for you</h2>
<p class="note">The agent waits for your answer; with none before the host's <code>--permission-timeout</code>, or on a cancel, the request is answered <code>cancelled</code>.</p>
<ol id="permissions">
{{range .PendingPermissions}}<li class="permission" data-request="{{.RequestID}}">
<p>Request <span class="mono">{{.RequestID}}</span>, asked {{stamp .Time}}: <span class="mono">{{printf "%s" .ToolCall}}</span></p>
{{$req := .RequestID}}{{range .Options}}<form class="inline" method="post" action="/admin/jobs/{{$.Job.ID}}/permissions/{{$req}}">
<input type="hidden" name="csrf" value="{{$.CSRF}}">
<input type="hidden" name="option_id" value="{{.OptionID}}">
<button type="submit" data-option="{{.OptionID}}" data-kind="{{.Kind}}">{{.Name}}</button>
</form>
{{end}}<p class="note">Or: <code>controlplane permit {{$.Job.ID}} {{$req}} OPTION</code> with one of {{range $i, $o := .Options}}{{if $i}}, {{end}}<code>{{$o.OptionID}}</code> ({{$o.Kind}}){{end}}.</p>
</li>
{{end}}</ol>
{{end}}
{{end}}

<h2>Attempts</h2>
{{if not .Attempts}}<p id="no-attempts">No host has claimed this job yet.</p>{{end}}
<ol id="attempts">
{{range .Attempts}}<li class="attempt" data-attempt="{{.ID}}" data-generation="{{.Generation}}">
<h3>Generation {{.Generation}} on {{.LeaseOwner}}: {{.State}}{{with .Outcome}} ({{.}}){{end}}</h3>
<table>
<tr><th>Attempt</th><td class="mono">{{.ID}}</td></tr>
<tr><th>lease_owner</th><td>{{.LeaseOwner}}</td></tr>
<tr><th>Claimed</th><td>{{stamp .ClaimedAt}}</td></tr>
<tr><th>lease_expires_at</th><td>{{stamp .LeaseExpiresAt}}{{if eq .State "running"}}{{if before .LeaseExpiresAt $.Now}} <span class="stale">(expired {{until .LeaseExpiresAt $.Now}} ago)</span>{{else}} (in {{until $.Now .LeaseExpiresAt}}){{end}}{{end}}</td></tr>
{{with .EndedAt}}<tr><th>Ended</th><td>{{stamp .}}</td></tr>{{end}}
{{with .ContainerID}}<tr><th>Container</th><td class="mono">{{.}}</td></tr>{{end}}
{{with .ActivationID}}<tr><th>Activation</th><td class="mono">{{.}}</td></tr>{{end}}
<tr><th>Counts as an attempt</th><td>{{if .CountsAsAttempt}}yes{{else}}no{{end}}</td></tr>
</table>
{{if eq .State "superseded"}}<p class="note superseded">Superseded by the reaper: no renewal of this lease was persisted in time. That alone does not show what the host did, nor that another attempt ran.
{{with .Next}}The next attempt, generation {{.Generation}} on {{.LeaseOwner}}, has its own events below.{{else}}No later attempt of this job has any event.{{end}}</p>{{end}}
{{if .Stale}}<p class="stale">{{.Stale}} write(s) from this attempt arrived after its lease was lost and were refused (lease.stale_report).</p>{{end}}
{{if .Events}}<table class="events">
<thead><tr><th>Time</th><th>Source</th><th>Event</th><th>Data</th></tr></thead>
<tbody>{{range .Events}}<tr{{if eq .Type "lease.stale_report"}} class="stale"{{end}}><td><time datetime="{{iso .Time}}">{{stamp .Time}}</time></td><td>{{.Source}}</td><td>{{.Type}}</td><td class="mono">{{printf "%s" .Data}}</td></tr>
{{end}}</tbody></table>{{else}}<p class="note">No event of this attempt.</p>{{end}}
</li>
{{end}}</ol>

<h2>Every event in order</h2>
<table id="timeline">
<thead><tr><th>#</th><th>Time</th><th>Attempt</th><th>Source</th><th>Event</th><th>Data</th></tr></thead>
<tbody>{{range .Events}}<tr{{if .Stale}} class="stale"{{end}}><td class="num">{{.ID}}</td><td><time datetime="{{iso .Time}}">{{stamp .Time}}</time></td><td>{{if .Generation}}generation {{.Generation}}{{else}}job{{end}}</td><td>{{.Source}}</td><td>{{.Type}}</td><td class="mono">{{printf "%s" .Data}}</td></tr>
{{end}}</tbody></table>
{{end}}`)

func (s *Server) handleJobPage(w http.ResponseWriter, r *http.Request) {
	p, ok := s.page(w, r, "job_page", "jobs")
	if !ok {
		return
	}
	j, err := s.cfg.Store.GetJob(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, "job_page", err)
		return
	}
	s.render(w, r, jobPage, "job_page", newJobView(p, j))
}

// conversationsPage is Admin → Conversations. A LOST one reads in the
// owner's plain words (R32); the host and container are the operator's
// detail beside them.
var conversationsPage = adminPage(`{{define "title"}}Conversations{{end}}{{define "content"}}
<h1>Conversations</h1>
<p>{{len .Conversations}} conversation(s).</p>
{{if .Conversations}}
<table id="conversations">
<thead><tr><th>Conversation</th><th>Title</th><th>State</th><th>Sandbox host</th><th>Container</th><th>Turns settled</th><th>Created</th><th></th></tr></thead>
<tbody>
{{range .Conversations}}<tr data-conversation="{{.ID}}">
<td><a class="mono" href="/admin/jobs?conversation={{.ID}}">{{.ID}}</a></td>
<td>{{.Title}}</td>
<td class="state">{{if eq .State "lost"}}<span class="lost">Lost</span>: {{.LostReason}}{{else if eq .State "deleted"}}<span class="deleted">Deleted</span>: its owner deleted it; it takes no new messages{{else if eq .State "quarantined"}}<span class="quarantined">Quarantined</span>: the reply of <a class="mono" href="/admin/jobs/{{.InterruptedJobID}}">{{.InterruptedJobID}}</a> was interrupted; the next turn verifies the sandbox, then resumes or reports it lost{{else}}<span class="usable">Usable</span>{{end}}</td>
<td>{{.SandboxHost}}{{with .SandboxState}} <span class="sandbox-{{.}}">({{.}})</span>{{end}}</td>
<td class="mono">{{.ContainerID}}</td>
<td class="num">{{.NativeTurn}}</td>
<td>{{stamp .CreatedAt}}</td>
<td>{{if and (ne .State "lost") (ne .State "deleted")}}<form class="inline" method="post" action="/admin/conversations/{{.ID}}/lose">
<input type="hidden" name="csrf" value="{{$.CSRF}}">
<input type="text" name="reason" required maxlength="1024" placeholder="why (the audit records it)" aria-label="reason">
<button type="submit" title="For when the host holding its sandbox is gone for good">Mark lost</button>
</form>{{end}}</td>
</tr>
{{end}}</tbody>
</table>
<p class="note">Mark lost only when the host holding the conversation's sandbox is gone for good: its waiting messages then fail in plain words. It is refused while a turn runs.</p>
{{end}}{{end}}`)

func (s *Server) handleConversationsPage(w http.ResponseWriter, r *http.Request) {
	p, ok := s.page(w, r, "conversations_page", "conversations")
	if !ok {
		return
	}
	list, err := s.cfg.Store.ListConversations(r.Context())
	if err != nil {
		s.fail(w, r, "conversations_page", err)
		return
	}
	s.render(w, r, conversationsPage, "conversations_page", struct {
		page
		Conversations []wire.Conversation
	}{p, list})
}

// errorPage answers a refused admin form in words, with a way back.
var errorPage = adminPage(`{{define "title"}}Refused{{end}}{{define "content"}}
<h1>Refused</h1>
<p id="refusal">{{.Message}}</p>
<p><a href="{{.Back}}">Back</a></p>
{{end}}`)

// formDone ends an admin form: on success back to the page it came from
// (303, so a reload does not post again); on a refusal the store decided,
// a page saying why with its status; else as any failure.
func (s *Server) formDone(w http.ResponseWriter, r *http.Request, op, back string, err error) {
	if err == nil {
		http.Redirect(w, r, back, http.StatusSeeOther)
		return
	}
	ae, ok := fromStore(err)
	if !ok {
		s.fail(w, r, op, err)
		return
	}
	msg := ae.message
	if errors.Is(err, store.ErrInvalid) && op == "lose_conversation_form" {
		msg = "A turn of this conversation is running; its lease decides first. Cancel it, or wait for it to end."
	}
	var buf bytes.Buffer
	if err := errorPage.ExecuteTemplate(&buf, "page", struct {
		page
		Message, Back string
	}{page{Now: s.cfg.Now(), Refresh: int(AdminRefresh / time.Second)}, msg, back}); err != nil {
		writeError(w, ae)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(ae.status)
	_, _ = w.Write(buf.Bytes())
}

// handleCancelJobForm is the job page's Cancel button.
func (s *Server) handleCancelJobForm(w http.ResponseWriter, r *http.Request) {
	now, ok := s.now(w, r, "cancel_job_form")
	if !ok {
		return
	}
	id := r.PathValue("id")
	_, err := s.cfg.Store.CancelJob(r.Context(), id, now)
	s.formDone(w, r, "cancel_job_form", "/admin/jobs/"+url.PathEscape(id), err)
}

// handlePermitForm is the job page's answer to a pending permission
// request: one button per option.
func (s *Server) handlePermitForm(w http.ResponseWriter, r *http.Request) {
	now, ok := s.now(w, r, "permit_form")
	if !ok {
		return
	}
	id := r.PathValue("id")
	err := s.cfg.Store.AnswerPermission(r.Context(), id, r.PathValue("request"), r.PostFormValue("option_id"), now)
	s.formDone(w, r, "permit_form", "/admin/jobs/"+url.PathEscape(id), err)
}

// handleLoseConversationForm is Admin → Conversations' Mark lost button.
func (s *Server) handleLoseConversationForm(w http.ResponseWriter, r *http.Request) {
	now, ok := s.now(w, r, "lose_conversation_form")
	if !ok {
		return
	}
	if e := checkReason(r.PostFormValue("reason"), true); e != nil {
		s.formDone(w, r, "lose_conversation_form", "/admin/conversations", e)
		return
	}
	_, err := s.loseConversation(r, r.PostFormValue("reason"), now)
	s.formDone(w, r, "lose_conversation_form", "/admin/conversations", err)
}

// loseConversation marks the path's conversation LOST on an operator's
// word and records it, in the audit with the reason.
func (s *Server) loseConversation(r *http.Request, reason string, now time.Time) (wire.Conversation, error) {
	c, err := s.cfg.Store.LoseConversation(r.Context(), r.PathValue("id"), audit(r, reason), now)
	if err != nil || c.State == wire.ConversationDeleted {
		return c, err // a deleted conversation stays deleted: nothing was marked
	}
	s.log.LogAttrs(r.Context(), slog.LevelWarn, MsgLostByOperator,
		slog.String("conversation_id", c.ID), slog.String("sandbox_host", c.SandboxHost))
	return c, nil
}

// handleLoseConversation marks a conversation LOST for an operator whose
// host holding its sandbox is gone for good: its waiting turns fail in
// plain words instead of waiting for that host for ever. Refused (400)
// without a reason ({"reason": …}, which the audit records) and while a
// turn of it runs; a LOST conversation is answered as it is.
func (s *Server) handleLoseConversation(w http.ResponseWriter, r *http.Request) {
	now, ok := s.now(w, r, "lose_conversation")
	if !ok {
		return
	}
	var req wire.LoseRequest
	if r.ContentLength != 0 {
		if e := decode(w, r, &req); e != nil {
			writeError(w, e)
			return
		}
	}
	if e := checkReason(req.Reason, true); e != nil {
		writeError(w, e)
		return
	}
	c, err := s.loseConversation(r, req.Reason, now)
	if err != nil {
		s.fail(w, r, "lose_conversation", err)
		return
	}
	writeJSON(w, http.StatusOK, c)
}
