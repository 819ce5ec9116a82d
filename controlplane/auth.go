package controlplane

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"strings"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// Token prefixes say what a token is when one turns up where it should not.
const (
	HostTokenPrefix   = "rdh_"
	WorkerTokenPrefix = "rdw_"
	UserTokenPrefix   = "rdu_"
	// RegistrationTokenPrefix: a token daemons register themselves with.
	RegistrationTokenPrefix = "rdr_"
)

// RotatedToken is the host token a rotation with a grace gives the holder
// of previous: HMAC-SHA256 of the rotation's nonce keyed by previous. The
// store keeps the nonce and previous's hash, so only the host (and the
// control plane while the host presents previous) can derive it.
func RotatedToken(previous, nonce string) string {
	m := hmac.New(sha256.New, []byte(previous))
	m.Write([]byte("runnerd host token rotation\x00" + nonce))
	return HostTokenPrefix + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// NewToken returns prefix followed by 256 random bits, base64url.
func NewToken(prefix string) string {
	var b [32]byte
	rand.Read(b[:]) // never fails (crypto/rand, Go 1.24+)
	return prefix + base64.RawURLEncoding.EncodeToString(b[:])
}

// WorkerTokenFor is the worker token of a claim made with the host's
// idempotency key: HMAC-SHA256, keyed by that key, of the attempt id. The
// store keeps only its hash, as for every token; a replay of the claim
// (the same key with the same host token) derives the same token again,
// so nothing stores it, and nobody without the key can.
func WorkerTokenFor(key, attemptID string) string {
	m := hmac.New(sha256.New, []byte(key))
	m.Write([]byte("runnerd worker token\x00" + attemptID))
	return WorkerTokenPrefix + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// newAttemptID is the id of an attempt whose worker token derives from it
// (WorkerTokenFor), in the store's own form.
func newAttemptID() string { return "att_" + strings.ToLower(rand.Text()) }

// HashToken is the only form of a token the store keeps.
func HashToken(token string) []byte {
	h := sha256.Sum256([]byte(token))
	return h[:]
}

// bearer returns the token of an "Authorization: Bearer" header, or, for
// a browser on the admin page, the password of Basic authentication.
func bearer(r *http.Request) string {
	tok, _ := credential(r)
	return tok
}

// credential is bearer, also saying whether the token came from Basic
// authentication: the credential a browser caches and sends by itself,
// to any site's request.
func credential(r *http.Request) (token string, basic bool) {
	h := r.Header.Get("Authorization")
	scheme, tok, ok := strings.Cut(h, " ")
	if ok && strings.EqualFold(scheme, "Bearer") {
		return strings.TrimSpace(tok), false
	}
	if _, pw, ok := r.BasicAuth(); ok {
		return pw, true
	}
	return "", false
}

// safeMethod: a request that changes nothing (net/http's CrossOriginProtection
// lets these through too).
func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// errBasicNotForWrites refuses a change sent with Basic credentials anywhere
// but the admin pages' own forms: a browser attaches cached Basic
// credentials to a form another site makes it post.
var errBasicNotForWrites = refuse(http.StatusUnauthorized, wire.CodeUnauthorized,
	"This call needs the token in an Authorization: Bearer header; Basic credentials only open the admin pages and their forms.")

// errCrossOrigin refuses a browser's change sent from another origin.
var errCrossOrigin = refuse(http.StatusForbidden, wire.CodeForbidden,
	"This request came from another site's page and was refused.")

// user wraps a user-API handler with the user token check: the token must
// be one the store holds and has not revoked. Neither the token nor its
// hash is ever logged or echoed. A change (any method but GET, HEAD and
// OPTIONS) is refused when a browser sent it from another origin, and
// when its token came by Basic authentication (see adminForm).
func (s *Server) user(h http.HandlerFunc) http.HandlerFunc { return s.userAuth(false, h) }

// userAuth is user; form says h is an admin form, which checks its own
// CSRF token and so may take Basic credentials.
func (s *Server) userAuth(form bool, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := s.cop.Check(r); err != nil {
			writeError(w, errCrossOrigin)
			return
		}
		tok, basic := credential(r)
		if basic && !form && !safeMethod(r.Method) {
			writeError(w, errBasicNotForWrites)
			return
		}
		refused := errNoToken
		if tok != "" {
			t, err := s.cfg.Store.UserTokenByHash(r.Context(), HashToken(tok))
			switch {
			case err == nil && t.RevokedAt == nil:
				h(w, r.WithContext(context.WithValue(r.Context(), actorKey{}, t.Name)))
				return
			case err != nil && !errors.Is(err, store.ErrUnauthorized):
				s.fail(w, r, "user_token", err)
				return
			}
			refused = errBadToken
		}
		if strings.HasPrefix(r.URL.Path, "/admin/") {
			w.Header().Set("WWW-Authenticate", `Basic realm="runnerd control plane", charset="UTF-8"`)
		}
		writeError(w, refused)
	}
}

// actorKey is the context key of the name of the user token a request
// was authorized by: the audit's actor.
type actorKey struct{}

// audit is who asks for r's admin action, and why.
func audit(r *http.Request, reason string) store.Audit {
	name, _ := r.Context().Value(actorKey{}).(string)
	return store.Audit{Actor: name, Reason: reason}
}

// host authenticates a host token, from the replica's cache when the
// store accepted it within HostTokenCache. A previous token (a rotation's
// grace) is never cached: it is refused from the grace's end on, judged
// on the store's clock.
func (s *Server) host(w http.ResponseWriter, r *http.Request, op string) (store.Host, bool) {
	tok := bearer(r)
	if tok == "" {
		writeError(w, errNoToken)
		return store.Host{}, false
	}
	hash, now := HashToken(tok), s.cfg.Now()
	if h, ok := s.hosts.get(hash, now); ok {
		return h, true
	}
	h, err := s.cfg.Store.HostByTokenHash(r.Context(), hash)
	if err != nil {
		s.fail(w, r, op, err)
		return store.Host{}, false
	}
	if h.Previous != nil {
		at, ok := s.now(w, r, op)
		if !ok {
			return store.Host{}, false
		}
		if !at.Before(h.Previous.Until) {
			writeError(w, errBadToken)
			return store.Host{}, false
		}
		return h, true
	}
	s.hosts.put(hash, h, now)
	return h, true
}

// attempt authenticates a worker token for the path's job.
func (s *Server) attempt(w http.ResponseWriter, r *http.Request, op string) (store.AttemptAuth, bool) {
	tok := bearer(r)
	if tok == "" {
		writeError(w, errNoToken)
		return store.AttemptAuth{}, false
	}
	a, err := s.cfg.Store.AuthorizeAttempt(r.Context(), r.PathValue("job"), HashToken(tok))
	if err != nil {
		s.fail(w, r, op, err)
		return store.AttemptAuth{}, false
	}
	return a, true
}
