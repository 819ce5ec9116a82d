package controlplane

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// Paths of the admin API's host lifecycle (user token, bearer only).
const (
	PathAdminHost = "/v1/admin/hosts/{name}/" // + pause, resume, rotate-token, remove
)

// MaxRotateGrace bounds a rotation's grace.
const MaxRotateGrace = 7 * 24 * time.Hour

// bearerOnly refuses a request that does not carry its token in an
// "Authorization: Bearer" header. A browser that cached the admin page's
// Basic credentials sends them to any page that posts here; a header it
// does not set by itself is what another site cannot forge.
func bearerOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		scheme, _, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		if !strings.EqualFold(scheme, "Bearer") {
			writeError(w, errNoToken)
			return
		}
		h(w, r)
	}
}

// handleHostAction is POST /v1/admin/hosts/{name}/{action}: pause, resume,
// rotate-token or remove. It answers the host as ListServers shows it
// (rotate-token: its new token, once; remove: 204).
func (s *Server) handleHostAction(action string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		now, ok := s.now(w, r, "host_"+strings.ReplaceAll(action, "-", "_"))
		if !ok {
			return
		}
		var err error
		var token string
		var graceUntil *time.Time
		var hreq wire.HostActionRequest
		if action != "rotate-token" && r.ContentLength != 0 {
			if e := decode(w, r, &hreq); e != nil {
				writeError(w, e)
				return
			}
		}
		if e := checkReason(hreq.Reason, action == "remove"); e != nil {
			writeError(w, e)
			return
		}
		switch action {
		case "pause", "resume":
			err = s.cfg.Store.PauseHost(r.Context(), name, action == "pause", audit(r, hreq.Reason), now)
		case "rotate-token":
			var req wire.RotateTokenRequest
			if r.ContentLength != 0 {
				if e := decode(w, r, &req); e != nil {
					writeError(w, e)
					return
				}
			}
			if e := checkReason(req.Reason, false); e != nil {
				writeError(w, e)
				return
			}
			grace := wire.DefaultRotateGrace
			if req.GraceMS != nil {
				grace = time.Duration(*req.GraceMS) * time.Millisecond
			}
			if grace < 0 || grace > MaxRotateGrace {
				writeError(w, invalid("grace_ms must be 0 to %d (%s).", MaxRotateGrace.Milliseconds(), MaxRotateGrace))
				return
			}
			rot := store.HostRotation{}
			if grace == 0 {
				token = NewToken(HostTokenPrefix)
				rot.TokenHash = HashToken(token)
			} else {
				until := now.Add(grace)
				rot.Nonce, rot.GraceUntil, graceUntil = rand.Text(), until, &until
			}
			err = s.cfg.Store.RotateHostToken(r.Context(), name, rot, audit(r, req.Reason), now)
		case "remove":
			err = s.cfg.Store.RemoveHost(r.Context(), name, audit(r, hreq.Reason), now)
		}
		s.hosts.forget() // whatever the answer: the change may have committed
		if errors.Is(err, store.ErrNotFound) {
			writeError(w, refuse(http.StatusNotFound, wire.CodeNotFound, "No host of that name is registered."))
			return
		}
		if err != nil {
			s.fail(w, r, "host_"+strings.ReplaceAll(action, "-", "_"), err)
			return
		}
		s.log.LogAttrs(r.Context(), slog.LevelInfo, MsgHostChanged, slog.String("host", name), slog.String("action", action))
		switch action {
		case "rotate-token":
			writeJSON(w, http.StatusOK, wire.HostTokenResponse{Name: name, Token: token, GraceUntil: graceUntil})
		case "remove":
			w.WriteHeader(http.StatusNoContent)
		default:
			list, ok := s.servers(w, r)
			if !ok {
				return
			}
			for _, sv := range list {
				if sv.Name == name {
					writeJSON(w, http.StatusOK, sv)
					return
				}
			}
			writeError(w, refuse(http.StatusNotFound, wire.CodeNotFound, "No host of that name is registered."))
		}
	}
}

// checkReason checks an admin action's reason, which the audit records:
// required says the action may not go without one (remove).
func checkReason(reason string, required bool) *apiError {
	switch {
	case required && strings.TrimSpace(reason) == "":
		return invalid("reason is required: say why (the audit records it with your token's name).")
	case len(reason) > wire.MaxAuditReason:
		return invalid("reason is at most %d bytes.", wire.MaxAuditReason)
	}
	return nil
}

// readyTimeout bounds /readyz's questions to the database.
const readyTimeout = 2 * time.Second

// handleHealthz: the process answers.
func (s *Server) handleHealthz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write([]byte("ok\n"))
}

// handleReadyz: the database answers and its schema is current. The
// answer names the reason in a word, never the error's text.
func (s *Server) handleReadyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
	defer cancel()
	w.Header().Set("Cache-Control", "no-store")
	switch err := s.cfg.Store.Ready(ctx); {
	case err == nil:
		_, _ = w.Write([]byte("ready\n"))
	case errors.Is(err, store.ErrSchemaBehind):
		http.Error(w, "not ready: migrations not applied", http.StatusServiceUnavailable)
	default:
		http.Error(w, "not ready: database unreachable ("+errorClass(err)+")", http.StatusServiceUnavailable)
	}
}

// handleRegister is POST /v1/agent/register with a registration token: the
// daemon registers itself under its name with the labels it will carry
// and gets its own host token, shown this once. Nothing is registered
// when the answer is not 200.
func (s *Server) handleRegister(w http.ResponseWriter, r *http.Request) {
	const op = "register"
	tok := bearer(r)
	if tok == "" {
		writeError(w, errNoToken)
		return
	}
	var req wire.RegisterRequest
	if e := decode(w, r, &req, "name"); e != nil {
		writeError(w, e)
		return
	}
	if msg := checkHostName(req.Name); msg != "" {
		writeError(w, invalid("%s", msg))
		return
	}
	if err := req.Labels.Check(); err != nil {
		writeError(w, invalid("labels: %s.", err))
		return
	}
	for _, k := range []string{wire.LabelSandbox, wire.LabelOS, wire.LabelArch} {
		if _, ok := req.Labels[k]; ok {
			writeError(w, invalid("labels: %q is an automatic label, set by the daemon's heartbeats; it cannot be registered.", k))
			return
		}
	}
	if len(req.Version) > 64 {
		writeError(w, invalid("version is at most 64 bytes."))
		return
	}
	now, ok := s.now(w, r, op)
	if !ok {
		return
	}
	hostToken := NewToken(HostTokenPrefix)
	_, err := s.cfg.Store.RegisterHost(r.Context(), HashToken(tok), req.Name, req.Labels, HashToken(hostToken), now)
	switch {
	case errors.Is(err, store.ErrRegistrationExpired):
		writeError(w, refuse(http.StatusUnauthorized, wire.CodeRegistrationExpired, "The registration token has expired; create another (controlplane registration-token create)."))
		return
	case errors.Is(err, store.ErrRegistrationUsedUp):
		writeError(w, refuse(http.StatusUnauthorized, wire.CodeRegistrationUsedUp, "The registration token has registered as many hosts as it may; create another (controlplane registration-token create)."))
		return
	case errors.Is(err, store.ErrLabelNotGranted):
		// The label is the daemon's own configuration, no secret.
		_, label, _ := strings.Cut(err.Error(), store.ErrLabelNotGranted.Error()+": ")
		writeError(w, refuse(http.StatusForbidden, wire.CodeForbidden, "The registration token does not grant the label "+label+"."))
		return
	case errors.Is(err, store.ErrExists):
		writeError(w, refuse(http.StatusConflict, wire.CodeHostExists, "A host named "+req.Name+" is registered already; give this one another name, or remove that host first."))
		return
	case err != nil:
		s.fail(w, r, op, err)
		return
	}
	s.hosts.forget() // a removed host's name registered anew
	s.log.LogAttrs(r.Context(), slog.LevelInfo, MsgHostRegistered, slog.String("host", req.Name), slog.String("version", req.Version))
	writeJSON(w, http.StatusOK, wire.RegisterResponse{Name: req.Name, HostToken: hostToken})
}

// checkHostName is what a host name may hold (as controlplane host add
// checks it): "" when name is one.
func checkHostName(name string) string {
	if name == "" || len(name) > 128 {
		return "name must be 1 to 128 bytes."
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_') {
			return "name may hold only letters, digits, '.', '-' and '_'."
		}
	}
	return ""
}
