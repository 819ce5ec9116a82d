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
	"strconv"
	"strings"
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
	"lookText": func(look string) string { return lookTexts[look] },
	"times":    timesOf,
}

// adminLayout is the frame of every page: title, refresh, navigation.
const adminLayout = `{{define "page"}}<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
{{if .Refresh}}<meta http-equiv="refresh" content="{{.Refresh}}">{{end}}
<title>{{template "title" .}} · runnerd control plane</title>
<style>
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em 2em; color: #222; }
nav { margin-bottom: 1em; }
nav a { margin-right: 1.2em; }
nav a.here { font-weight: 700; text-decoration: none; color: #222; }
table { border-collapse: collapse; margin-bottom: 1.2em; max-width: 100%; }
th, td { text-align: left; padding: .3em .8em; border-bottom: 1px solid #ddd; vertical-align: top; }
th { background: #f4f4f4; }
td.num { text-align: right; }
time, .stamp, .dur { white-space: nowrap; }
code, .mono { font-family: ui-monospace, monospace; font-size: 13px; overflow-wrap: anywhere; word-break: break-all; }
h1 .mono { font-size: inherit; }
.look { display: inline-block; padding: 0 .45em; border-radius: 3px; font-weight: 600; }
.host-online { color: #17632a; background: #e2f3e5; }
.host-launch-paused { color: #fff; background: #b3261e; }
.host-sandbox-pressure, .host-claims-withheld, .host-paused, .host-draining { color: #5c3c00; background: #fde9b8; }
.host-drained { color: #444; background: #e4e4e4; border: 1px dashed #888; }
.host-offline { color: #fff; background: #6b0000; }
dl.totals { display: flex; flex-wrap: wrap; gap: .6em; margin: 0 0 1.2em; }
dl.totals div { border: 1px solid #ccc; border-radius: 4px; padding: .3em .8em; min-width: 7em; }
dl.totals dt { font-size: 12px; color: #555; }
dl.totals dd { margin: 0; font-size: 20px; font-weight: 600; }
dl.totals div.zero dd { color: #999; }
ul.turns { margin: 0; padding-left: 1.1em; }
#servers td:first-child { white-space: nowrap; }
.conv-title { font-weight: 600; }
.conv-title, .label, .pause-reason { overflow-wrap: anywhere; }
td.id .mono { word-break: normal; overflow-wrap: normal; white-space: nowrap; }
.untitled { color: #777; font-style: italic; }
input.confirm { font-family: ui-monospace, monospace; width: 32em; max-width: 100%; }
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
<p class="note">As of <time datetime="{{iso .Now}}">{{stamp .Now}}</time> on the store's clock{{with .Skew}}; this replica's own clock is {{.}} off the store's, on which leases are judged{{end}}{{if .Refresh}}; this page reloads every {{.Refresh}} s{{end}}.</p>
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
	Refresh int           // seconds between reloads; 0: the page does not reload
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
{{with .Totals}}<dl class="totals" id="totals">
<div><dt>Hosts</dt><dd id="total-hosts">{{.Hosts}}</dd></div>
{{range .ByLook}}<div class="{{if not .N}}zero{{end}}"><dt><span class="look host-{{.Look}}">{{.Look}}</span></dt><dd data-look="{{.Look}}">{{.N}}</dd></div>
{{end}}<div><dt>Turns running</dt><dd id="total-running">{{.Running}}</dd></div>
<div><dt>Turns queued</dt><dd id="total-queued">{{.Queued}}</dd></div>
<div><dt>Capacity used / total</dt><dd id="total-capacity">{{.Used}} / {{.Capacity}}</dd></div>
<div><dt>Free slots taking turns</dt><dd id="total-free">{{.Free}}</dd></div>
</dl>
<p class="note">Capacity counts the hosts heard from (not offline or drained); free slots are those of the hosts shown online, which are given new turns.</p>{{end}}
{{if .Servers}}
<table id="servers">
<thead><tr><th>Host</th><th>State</th><th>Labels</th><th>Last heartbeat</th><th>Running / capacity</th><th>Current turns</th><th>Launch error</th><th>Version</th><th>Jobs</th><th></th></tr></thead>
<tbody>
{{range .Servers}}{{$state := .State}}{{$sv := .}}<tr data-host="{{.Name}}" data-look="{{.Look}}">
<td>{{.Name}}</td>
<td class="host-state"><span class="look host-{{.Look}}" data-state="{{.State}}">{{lookText .Look}}</span>{{if eq .State "offline"}}{{if eq .Look "drained"}}: stopped after draining; its last heartbeat said it stops and it holds no turn{{else}}: no heartbeat for {{offlineAfter .Server}}{{with .Running}}; {{.}} turn(s) leased to it wait for the reaper{{end}}{{end}}{{end}}{{with .PausedAt}}{{if eq $state "paused"}} since{{else}}<br><span class="paused">paused since</span>{{end}} <time datetime="{{iso .}}">{{stamp .}}</time>{{end}}{{if .PausedAt}}{{with .PausedBy}} <span class="paused-by">by {{.}}</span>{{end}}{{with .PauseReason}}: <span class="pause-reason">{{.}}</span>{{end}}{{end}}{{if .Draining}}{{if ne .State "draining"}}<br>last said draining{{end}}{{end}}{{with .ClaimsWithheld}}<br><span class="paused">claims withheld: {{.}}</span>{{end}}{{with .Conflict}}<br><span class="host-conflict offline">conflict: two daemons present this host's token.{{with $sv.Instance}}
live: instance <code>{{.ID}}</code> boot <code>{{.BootID}}</code>, seen <time datetime="{{iso .LastSeen}}">{{stamp .LastSeen}}</time>;{{end}}
refused host_token_in_use: instance <code>{{.ID}}</code> boot <code>{{.BootID}}</code>, seen <time datetime="{{iso .LastSeen}}">{{stamp .LastSeen}}</time></span>{{end}}</td>
<td class="labels">{{range $k, $v := .Labels}}<code class="label">{{$k}}={{$v}}</code> {{else}}none{{end}}</td>
<td>{{if .LastHeartbeat}}<time datetime="{{iso .LastHeartbeat}}">{{ago $.Now .LastHeartbeat}}</time>{{else}}never{{end}}</td>
<td class="num">{{.Running}} / {{.Capacity}}</td>
<td class="turns">{{if .Turns}}<ul class="turns">{{range .Turns}}<li><a class="mono" href="/admin/jobs/{{.JobID}}">{{.JobID}}</a> <span class="note">turn {{.Seq}}, <span class="dur">{{.For}}</span></span></li>{{end}}</ul>{{else}}none{{end}}</td>
<td>{{with .LaunchError}}<span class="launch-error">{{.Class}}: {{.Consecutive}} consecutive launch failure(s) since <time datetime="{{iso .Since}}">{{stamp .Since}}</time>; claims paused</span>{{else}}none{{end}}{{with .SandboxPressure}}<br><span class="sandbox-pressure">sandbox_pressure: {{.Resource}} {{.FreeBytes}} of {{.TotalBytes}} bytes free (at least {{.MinFreeBytes}} wanted) since <time datetime="{{iso .Since}}">{{stamp .Since}}</time>; first turns withheld, its conversations' turns still run</span>{{end}}</td>
<td>{{.Version}}</td>
<td><a href="/admin/jobs?host={{.Name}}">jobs</a></td>
<td><form class="inline" method="post" action="/admin/servers/{{.Name}}/{{if .PausedAt}}resume{{else}}pause{{end}}">
<input type="hidden" name="csrf" value="{{$.CSRF}}">
{{if not .PausedAt}}<input type="text" name="reason" maxlength="1024" size="10" placeholder="reason" aria-label="reason for the pause">{{end}}
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
	stats, err := s.cfg.Store.Stats(r.Context())
	if err != nil {
		s.fail(w, r, "servers_page", err)
		return
	}
	running, err := s.cfg.Store.RunningTurns(r.Context())
	if err != nil {
		s.fail(w, r, "servers_page", err)
		return
	}
	hosts, totals := fleetOf(list, running, stats, p.Now)
	s.render(w, r, serversPage, "servers_page", struct {
		page
		Servers      []hostView
		Totals       fleetTotals
		OfflineAfter int
	}{p, hosts, totals, wire.OfflineAfterIntervals})
}

// Host looks: how Admin → Servers shows a host, its wire state refined.
// Only a host that is given new turns is shown online (green): one whose
// launches fail (R37), under sandbox pressure (S2) or withholding its
// claims is not. A host that drained and stopped is told from one that
// went silent (dead), which may have held turns.
const (
	lookOnline         = "online"
	lookLaunchPaused   = "launch-paused"
	lookPressure       = "sandbox-pressure"
	lookClaimsWithheld = "claims-withheld"
	lookPaused         = "paused"
	lookDraining       = "draining"
	lookDrained        = "drained"
	lookOffline        = "offline"
)

// hostLooks are the looks in the order the totals show them.
var hostLooks = []string{lookOnline, lookLaunchPaused, lookPressure, lookClaimsWithheld, lookPaused, lookDraining, lookDrained, lookOffline}

// lookTexts are the words beside each look's colour.
var lookTexts = map[string]string{
	lookOnline:         "online",
	lookLaunchPaused:   "launch-paused: online, its launches fail",
	lookPressure:       "sandbox_pressure: online, first turns withheld",
	lookClaimsWithheld: "online, claims withheld",
	lookPaused:         "paused",
	lookDraining:       "draining",
	lookDrained:        "drained",
	lookOffline:        "offline",
}

// hostLook is the look of sv, whose State is set.
func hostLook(sv wire.Server) string {
	switch sv.State {
	case wire.HostOffline:
		if sv.Running == 0 && sv.Instance != nil && sv.Instance.Stopping {
			return lookDrained
		}
		return lookOffline
	case wire.HostDraining:
		return lookDraining
	case wire.HostPaused:
		return lookPaused
	}
	switch {
	case sv.LaunchError != nil:
		return lookLaunchPaused
	case sv.SandboxPressure != nil:
		return lookPressure
	case sv.ClaimsWithheld != "":
		return lookClaimsWithheld
	}
	return lookOnline
}

// hostView is one host's row: the host, its look and the running turns
// leased to it.
type hostView struct {
	wire.Server
	Look  string
	Turns []hostTurn
}

// hostTurn is a running turn on a host's row.
type hostTurn struct {
	JobID string
	Seq   int64
	For   string // how long its attempt has held the lease
}

// lookCount is one look's count in the totals.
type lookCount struct {
	Look string
	N    int
}

// fleetTotals is the line at the top of Admin → Servers.
type fleetTotals struct {
	Hosts          int
	ByLook         []lookCount
	Running        int // jobs running, as the store counts them
	Queued         int // jobs queued
	Used, Capacity int // running turns and capacity of the hosts heard from
	Free           int // free slots of the hosts shown online
}

// fleetOf builds the rows and totals from the hosts, their running turns
// and the store's counts.
func fleetOf(list []wire.Server, running []store.RunningTurn, stats store.Stats, now time.Time) ([]hostView, fleetTotals) {
	byHost := map[string][]hostTurn{}
	for _, rt := range running {
		byHost[rt.Host] = append(byHost[rt.Host], hostTurn{JobID: rt.JobID, Seq: rt.Seq, For: duration(now.Sub(rt.ClaimedAt))})
	}
	t := fleetTotals{Hosts: len(list), Running: stats.JobsByState[wire.JobRunning], Queued: stats.JobsByState[wire.JobQueued]}
	n := map[string]int{}
	out := make([]hostView, 0, len(list))
	for _, sv := range list {
		v := hostView{Server: sv, Look: hostLook(sv), Turns: byHost[sv.Name]}
		n[v.Look]++
		if v.Look != lookOffline && v.Look != lookDrained {
			t.Used += sv.Running
			t.Capacity += sv.Capacity
		}
		if v.Look == lookOnline {
			t.Free += max(sv.Capacity-sv.Running, 0)
		}
		out = append(out, v)
	}
	for _, l := range hostLooks {
		t.ByLook = append(t.ByLook, lookCount{Look: l, N: n[l]})
	}
	return out, t
}

// duration is d as the pages show a wait or a run: to the second, or
// to the millisecond under one.
func duration(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
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
<label>Outcome <select name="outcome"><option value="">any</option>{{range .Outcomes}}<option{{if eq . $.Filter.Outcome}} selected{{end}}>{{.}}</option>{{end}}</select></label>
<label>Conversation <input name="conversation" value="{{.Filter.ConversationID}}" size="30"></label>
<label>Host <input name="host" value="{{.Filter.Host}}" size="14"></label>
<button type="submit">Filter</button> <a href="/admin/jobs">clear</a>
</form>
<p>{{len .Jobs}} job(s), newest first{{with .Older}} (<a id="older" href="{{.}}">older jobs</a>){{end}}.</p>
{{if .Jobs}}
<table id="jobs">
<thead><tr><th>Job</th><th>Conversation</th><th>Turn</th><th>State</th><th>Attempts</th><th>Last lease owner</th><th>Queue wait</th><th>Run time</th><th>Created / ended</th><th>Reason</th></tr></thead>
<tbody>
{{range .Jobs}}{{$tm := times . $.Now}}<tr data-job="{{.ID}}">
<td class="id"><a class="mono" href="/admin/jobs/{{.ID}}">{{.ID}}</a></td>
<td class="conv">{{with index $.Titles .ConversationID}}<span class="conv-title">{{.}}</span>{{else}}<span class="conv-title untitled">untitled</span>{{end}}<br><a class="mono" href="/admin/jobs?conversation={{.ConversationID}}">{{.ConversationID}}</a></td>
<td class="num">{{.Seq}}</td>
<td class="state">{{.State}}{{if .CancelRequested}} (cancel requested){{end}}{{with .Unroutable}} <span class="unroutable">unroutable{{with .Missing}}: needs {{range $i, $m := .}}{{if $i}}, {{end}}{{$m}}{{end}}{{end}}</span>{{end}}</td>
<td class="num">{{len .Attempts}}</td>
<td>{{with lastOwner .}}<a href="/admin/jobs?host={{.}}">{{.}}</a>{{end}}</td>
<td class="num wait"><span class="dur">{{$tm.Wait}}</span>{{if $tm.Waiting}} <span class="note">so far</span>{{end}}</td>
<td class="num run">{{if $tm.Ran}}<span class="dur">{{$tm.Run}}</span>{{if $tm.Running}} <span class="note">so far</span>{{end}}{{else}}<span class="note">not run</span>{{end}}</td>
<td><span class="stamp">{{stamp .CreatedAt}}</span>{{with .EndedAt}}<br><span class="stamp">{{stamp .}}</span>{{end}}</td>
<td class="reason">{{.Reason}}</td>
</tr>
{{end}}</tbody>
</table>
{{end}}{{end}}`)

// handleJobsPage is Admin → Jobs. Its filter is GET /v1/jobs' (an empty
// field of the page's form is no filter); a wrong one is answered with a
// page saying which, with a way back.
func (s *Server) handleJobsPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	for name, v := range q {
		if len(v) == 1 && v[0] == "" {
			q.Del(name) // the form's empty field
		}
	}
	r.URL.RawQuery = q.Encode()
	f, e := jobFilterOf(r, "Admin → Jobs")
	if e != nil {
		s.refusal(w, r, e, "Bad filter", "/admin/jobs")
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
	ids := make([]string, 0, len(list.Jobs))
	for _, j := range list.Jobs {
		if !slices.Contains(ids, j.ConversationID) {
			ids = append(ids, j.ConversationID)
		}
	}
	titles, err := s.cfg.Store.ConversationTitles(r.Context(), ids)
	if err != nil {
		s.fail(w, r, "jobs_page", err)
		return
	}
	older := ""
	if list.Next > 0 {
		q.Set("cursor", cursorPrefix+strconv.FormatInt(list.Next, 10))
		older = "/admin/jobs?" + q.Encode()
	}
	s.render(w, r, jobsPage, "jobs_page", struct {
		page
		Filter           store.JobFilter
		States, Outcomes []string
		Jobs             []wire.Job
		Titles           map[string]string
		Older            string
	}{p, f, jobStates, jobOutcomes, list.Jobs, titles, older})
}

// jobTimes are a job's queue wait and run time as of now: Run is the time
// its attempts held leases, Wait the rest of its life (queued, at first
// and again after a host loss or a release). Ran: an attempt began;
// Waiting, Running: the wait or the run goes on.
type jobTimes struct {
	Wait, Run        string
	Ran              bool
	Waiting, Running bool
}

func timesOf(j wire.Job, now time.Time) jobTimes {
	end := now
	if j.EndedAt != nil {
		end = *j.EndedAt
	}
	var run time.Duration
	var t jobTimes
	for _, a := range j.Attempts {
		to := end
		if a.EndedAt != nil {
			to = *a.EndedAt
		} else if a.State == wire.AttemptRunning && j.EndedAt == nil {
			t.Running = true
		}
		run += max(to.Sub(a.ClaimedAt), 0)
		t.Ran = true
	}
	t.Run = duration(run)
	t.Wait = duration(end.Sub(j.CreatedAt) - run)
	t.Waiting = j.State == wire.JobQueued
	return t
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
	Title    string // its conversation's
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
<tr><th>Conversation</th><td>{{with $.Title}}<span class="conv-title">{{.}}</span>{{else}}<span class="conv-title untitled">untitled</span>{{end}}: <a class="mono" href="/admin/jobs?conversation={{.ConversationID}}">{{.ConversationID}}</a>, turn {{.Seq}}</td></tr>
<tr><th>State</th><td class="state">{{.State}}{{with .Outcome}} ({{.}}){{end}}{{if .CancelRequested}}, cancel requested{{end}}</td></tr>
{{with .Reason}}<tr><th>Reason</th><td>{{.}}</td></tr>{{end}}
{{with .Cause}}<tr><th>Cause</th><td class="cause"><code>{{.}}</code>{{with $.Job.CauseEvidence}}: {{.}}{{end}}</td></tr>{{end}}
<tr><th>Admitted</th><td>{{if .Admitted}}yes: the prompt was handed to the agent{{else}}no{{end}}</td></tr>
<tr><th>Counts</th><td>{{.AttemptCount}} counted attempt(s), {{.WorkerLostCount}} host loss(es), {{.ReleaseCount}} release(s){{with .ReleaseClass}} (last: {{.}}){{end}}</td></tr>
{{with .NotBefore}}<tr><th>Not before</th><td>{{stamp .}} (release backoff)</td></tr>{{end}}
{{with .Unroutable}}<tr><th>Unroutable</th><td class="unroutable">no live host can take this turn{{if .Missing}}: missing {{range $i, $m := .Missing}}{{if $i}}, {{end}}<code>{{$m}}</code>{{end}}{{else}}: no host is online{{end}}, since {{stamp .Since}}. It stays queued until a host that has these labels heartbeats.</td></tr>{{end}}
<tr><th>Created</th><td>{{stamp .CreatedAt}}</td></tr>
{{with .EndedAt}}<tr><th>Ended</th><td>{{stamp .}}</td></tr>{{end}}
{{$tm := times . $.Now}}<tr><th>Queue wait</th><td class="wait"><span class="dur">{{$tm.Wait}}</span>{{if $tm.Waiting}} so far{{end}} <span class="note">(queued, before and between its attempts)</span></td></tr>
<tr><th>Run time</th><td class="run">{{if $tm.Ran}}<span class="dur">{{$tm.Run}}</span>{{if $tm.Running}} so far{{end}} <span class="note">(leases held by its attempts)</span>{{else}}not run{{end}}</td></tr>
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
	titles, err := s.cfg.Store.ConversationTitles(r.Context(), []string{j.ConversationID})
	if err != nil {
		s.fail(w, r, "job_page", err)
		return
	}
	v := newJobView(p, j)
	v.Title = titles[j.ConversationID]
	s.render(w, r, jobPage, "job_page", v)
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
<td>{{with .Title}}<span class="conv-title">{{.}}</span>{{else}}<span class="untitled">untitled</span>{{end}}</td>
<td class="state">{{if eq .State "lost"}}<span class="lost">Lost</span>: {{.LostReason}}{{else if eq .State "deleted"}}<span class="deleted">Deleted</span>: its owner deleted it; it takes no new messages{{else if eq .State "quarantined"}}<span class="quarantined">Quarantined</span>: the reply of <a class="mono" href="/admin/jobs/{{.InterruptedJobID}}">{{.InterruptedJobID}}</a> was interrupted; the next turn verifies the sandbox, then resumes or reports it lost{{else}}<span class="usable">Usable</span>{{end}}</td>
<td>{{.SandboxHost}}{{with .SandboxState}} <span class="sandbox-{{.}}">({{.}})</span>{{end}}</td>
<td class="mono">{{.ContainerID}}</td>
<td class="num">{{.NativeTurn}}</td>
<td>{{stamp .CreatedAt}}</td>
<td>{{if and (ne .State "lost") (ne .State "deleted")}}<a class="mark-lost" href="/admin/conversations/{{.ID}}/lose" title="For when the host holding its sandbox is gone for good">Mark lost…</a>{{end}}</td>
</tr>
{{end}}</tbody>
</table>
<p class="note">Mark lost only when the host holding the conversation's sandbox is gone for good: its waiting messages then fail in plain words. It asks you to confirm by typing the conversation's id, and is refused while a turn runs.</p>
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

// errorPage answers a refused admin form or a bad filter in words, with
// a way back.
var errorPage = adminPage(`{{define "title"}}{{.Heading}}{{end}}{{define "content"}}
<h1>{{.Heading}}</h1>
<p id="refusal">{{.Message}}</p>
<p><a id="back" href="{{.Back}}">Back</a></p>
{{end}}`)

// refusal answers ae as a page headed heading, with its status and a
// link to back; the page's chrome as on any admin page, on this replica's
// clock (the refusal may be that the store does not answer).
func (s *Server) refusal(w http.ResponseWriter, r *http.Request, ae *apiError, heading, back string) {
	var buf bytes.Buffer
	if err := errorPage.ExecuteTemplate(&buf, "page", struct {
		page
		Heading, Message, Back string
	}{page{Nav: navOf(back), Now: s.cfg.Now()}, heading, ae.message, back}); err != nil {
		writeError(w, ae)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'")
	w.WriteHeader(ae.status)
	_, _ = w.Write(buf.Bytes())
}

// navOf is the navigation entry of an admin path.
func navOf(path string) string {
	for _, n := range []string{"servers", "jobs", "conversations"} {
		if strings.HasPrefix(path, "/admin/"+n) {
			return n
		}
	}
	return ""
}

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
	if errors.Is(err, store.ErrInvalid) && op == "lose_conversation_form" {
		ae = refuse(ae.status, ae.code, "A turn of this conversation is running; its lease decides first. Cancel it, or wait for it to end.")
	}
	s.refusal(w, r, ae, "Refused", back)
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

// loseConfirmField is the field of the Mark lost form in which the
// operator types the conversation's id; the server compares it.
const loseConfirmField = "confirm"

// confirmLosePage asks the operator to confirm Mark lost, naming the
// conversation: its title, id, state and the host holding its sandbox.
var confirmLosePage = adminPage(`{{define "title"}}Mark lost?{{end}}{{define "content"}}
{{with .Conversation}}
<h1>Mark conversation {{with .Title}}“{{.}}”{{else}}<span class="untitled">untitled</span>{{end}} lost?</h1>
<table id="conversation">
<tr><th>Conversation</th><td class="mono" id="conversation-id">{{.ID}}</td></tr>
<tr><th>Title</th><td>{{with .Title}}{{.}}{{else}}<span class="untitled">untitled</span>{{end}}</td></tr>
<tr><th>State</th><td>{{.State}}</td></tr>
<tr><th>Sandbox host</th><td>{{with .SandboxHost}}{{.}}{{else}}none recorded{{end}}</td></tr>
<tr><th>Container</th><td class="mono">{{with .ContainerID}}{{.}}{{else}}none{{end}}</td></tr>
</table>
<p>Its sandbox and what the agent kept in it are given up: its waiting messages fail in plain words and it takes no new one. Do this only when the host holding its sandbox is gone for good. It cannot be undone.</p>
<form method="post" action="/admin/conversations/{{.ID}}/lose" id="lose">
<input type="hidden" name="csrf" value="{{$.CSRF}}">
<label>Type the conversation's id, <code>{{.ID}}</code>, to confirm:<br>
<input class="confirm" type="text" name="confirm" autocomplete="off" spellcheck="false" aria-label="the conversation's id"></label>
<p><label>Why (the audit records it):<br>
<input type="text" name="reason" required maxlength="1024" aria-label="reason"></label></p>
<p><button type="submit" id="confirm-lose">Mark {{.ID}} lost</button> <a href="/admin/conversations">Keep it</a></p>
</form>
{{end}}{{end}}`)

// handleConfirmLosePage is Admin → Conversations' Mark lost link: the
// confirmation, which names the conversation.
func (s *Server) handleConfirmLosePage(w http.ResponseWriter, r *http.Request) {
	p, ok := s.page(w, r, "confirm_lose_page", "conversations")
	if !ok {
		return
	}
	p.Refresh = 0 // a reload would clear what the operator is typing
	c, err := s.cfg.Store.GetConversation(r.Context(), r.PathValue("id"))
	if err != nil {
		if ae, ok := fromStore(err); ok {
			s.refusal(w, r, ae, "Refused", "/admin/conversations")
			return
		}
		s.fail(w, r, "confirm_lose_page", err)
		return
	}
	s.render(w, r, confirmLosePage, "confirm_lose_page", struct {
		page
		Conversation wire.Conversation
	}{p, c})
}

// errLoseUnconfirmed refuses a Mark lost form whose typed id is not the
// conversation's.
var errLoseUnconfirmed = invalid("To mark this conversation lost, type its id exactly in the confirmation field; nothing was changed.")

// handleLoseConversationForm is the Mark lost confirmation's button: it
// acts only when the typed id is the conversation's.
func (s *Server) handleLoseConversationForm(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	back := "/admin/conversations/" + url.PathEscape(id) + "/lose"
	if r.PostFormValue(loseConfirmField) != id {
		s.refusal(w, r, errLoseUnconfirmed, "Not confirmed", back)
		return
	}
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
