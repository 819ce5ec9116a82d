package controlplane

import (
	"bytes"
	"html/template"
	"log/slog"
	"net/http"
	"time"

	"github.com/runnerd/runnerd/wire"
)

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
		list[i].State = wire.HostState(list[i], now)
	}
	return list, true
}

func (s *Server) handleServersJSON(w http.ResponseWriter, r *http.Request) {
	if list, ok := s.servers(w, r); ok {
		writeJSON(w, http.StatusOK, wire.ServerList{Servers: list})
	}
}

// serversPage is Admin → Servers: every host with its last heartbeat,
// capacity, running turns, draining state and, beside it, the launch
// error that stopped its claims (R37).
var serversPage = template.Must(template.New("servers").Funcs(template.FuncMap{
	"ago": func(now time.Time, t *time.Time) string {
		if t == nil {
			return "never"
		}
		return now.Sub(*t).Truncate(time.Second).String() + " ago"
	},
	"stamp": func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
}).Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Servers · runnerd control plane</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; }
table { border-collapse: collapse; }
th, td { text-align: left; padding: .3em .8em; border-bottom: 1px solid #ddd; }
td.num { text-align: right; }
.launch-error { color: #a40000; font-weight: 600; }
.draining { color: #8a5a00; }
</style>
</head>
<body>
<h1>Servers</h1>
<p>{{len .Servers}} host(s) · as of {{stamp .Now}}{{with .Skew}} · this replica's own clock is {{.}} off the store's, on which leases are judged{{end}}</p>
{{if .Servers}}
<table>
<thead><tr><th>Host</th><th>State</th><th>Last heartbeat</th><th>Capacity</th><th>Running</th><th>Draining</th><th>Launch error</th><th>Version</th></tr></thead>
<tbody>
{{range .Servers}}<tr>
<td>{{.Name}}</td>
<td class="state-{{.State}}">{{.State}}</td>
<td>{{if .LastHeartbeat}}<time datetime="{{stamp .LastHeartbeat}}">{{ago $.Now .LastHeartbeat}}</time>{{else}}never{{end}}</td>
<td class="num">{{.Capacity}}</td>
<td class="num">{{.Running}}</td>
<td>{{if .Draining}}<span class="draining">draining</span>{{else}}no{{end}}</td>
<td>{{with .LaunchError}}<span class="launch-error">{{.Class}}: {{.Consecutive}} consecutive launch failure(s) since {{stamp .Since}}; claims paused</span>{{else}}none{{end}}</td>
<td>{{.Version}}</td>
</tr>
{{end}}</tbody>
</table>
{{else}}
<p>No host is registered. Add one with <code>controlplane host add NAME</code>.</p>
{{end}}
</body>
</html>
`))

func (s *Server) handleServersPage(w http.ResponseWriter, r *http.Request) {
	list, ok := s.servers(w, r)
	if !ok {
		return
	}
	now, ok := s.now(w, r, "servers_page")
	if !ok {
		return
	}
	var buf bytes.Buffer
	data := struct {
		Now     time.Time
		Skew    time.Duration // this replica's clock minus the store's
		Servers []wire.Server
	}{now, s.cfg.Now().Sub(now).Round(time.Second), list}
	if err := serversPage.Execute(&buf, data); err != nil {
		s.fail(w, r, "servers_page", err)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
	_, _ = w.Write(buf.Bytes())
}

// handleLoseConversation marks a conversation LOST for an operator whose
// host holding its sandbox is gone for good: its waiting turns fail in
// plain words instead of waiting for that host for ever. Refused (400)
// while a turn of it runs; a LOST conversation is answered as it is.
func (s *Server) handleLoseConversation(w http.ResponseWriter, r *http.Request) {
	now, ok := s.now(w, r, "lose_conversation")
	if !ok {
		return
	}
	c, err := s.cfg.Store.LoseConversation(r.Context(), r.PathValue("id"), now)
	if err != nil {
		s.fail(w, r, "lose_conversation", err)
		return
	}
	s.log.LogAttrs(r.Context(), slog.LevelWarn, MsgLostByOperator,
		slog.String("conversation_id", c.ID), slog.String("sandbox_host", c.SandboxHost))
	writeJSON(w, http.StatusOK, c)
}
