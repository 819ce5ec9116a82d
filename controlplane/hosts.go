package controlplane

import (
	"context"
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
		switch action {
		case "pause", "resume":
			err = s.cfg.Store.PauseHost(r.Context(), name, action == "pause", now)
		case "rotate-token":
			token = NewToken(HostTokenPrefix)
			err = s.cfg.Store.RotateHostToken(r.Context(), name, HashToken(token), now)
		case "remove":
			err = s.cfg.Store.RemoveHost(r.Context(), name, now)
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
			writeJSON(w, http.StatusOK, wire.HostTokenResponse{Name: name, Token: token})
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
