// Package controlplane is the reference control plane's HTTP server: the
// worker API the host daemons speak (wire paths, host and worker tokens),
// the user API (conversations, messages, jobs, events, cancel), the
// Admin → Servers page, and the reaper loop. Every rule about leases and
// conversations lives in the store (package controlplane/store); this
// package authenticates, decodes strictly, validates shapes and maps store
// errors to statuses and wire codes.
//
// Only cmd/controlplane and tests import this package. It imports wire and
// controlplane/store, nothing of the runner.
package controlplane

import (
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// Defaults of the Config fields.
const (
	DefaultLeaseTTL       = 120 * time.Second
	DefaultMinLeaseTTL    = 40 * time.Second // one renewal interval plus one request timeout (R12)
	DefaultMaxLeaseTTL    = 15 * time.Minute
	DefaultClaimWaitMax   = 30 * time.Second
	DefaultClaimRecheck   = 2 * time.Second
	DefaultReaperInterval = 5 * time.Second
	DefaultReaperGrace    = 30 * time.Second // at least the runner's SIGTERM→SIGKILL grace (P3)
	DefaultMaxWorkerLost  = 3
	DefaultRetention      = 30 * 24 * time.Hour // P8
)

// Config configures a Server. Zero fields mean the default.
type Config struct {
	// Store is required.
	Store store.Store
	// Logger receives the server's records; nil means slog.Default().
	Logger *slog.Logger
	// Now is this replica's own clock; nil means time.Now. Nothing is
	// judged or stored on it (K3): every time the server hands the store
	// comes from the store's one clock (Store.Now). The admin page shows
	// how far Now is from the store's clock, so an operator sees a skewed
	// replica.
	Now func() time.Time

	// LeaseTTL is the lease of a claim or renewal that asks for none.
	LeaseTTL time.Duration
	// MinLeaseTTL and MaxLeaseTTL bound a lease a runner asks for; a
	// request outside them is refused with 400 invalid.
	MinLeaseTTL time.Duration
	MaxLeaseTTL time.Duration
	// ClaimWaitMax caps the long poll of a claim and of an event follow.
	ClaimWaitMax time.Duration
	// ClaimRecheck is how often a waiting claim asks the store again
	// without its signal (Store.WorkSignal): the safety net for what no
	// signal announces, such as a release backoff (K7) that ended.
	ClaimRecheck time.Duration

	// ReaperInterval is the period of RunReaper's sweep. A gap in the
	// database's record of sweeps longer than three intervals (and at
	// least 10 s) counts as the control plane's own absence: a request is
	// never refused for an expiry inside it, and the next sweep gives
	// every running lease a full TTL (P4, K3).
	ReaperInterval time.Duration
	// ReaperGrace is added to a lease's expiry before the reaper
	// supersedes its attempt (P3).
	ReaperGrace time.Duration
	// MaxWorkerLost caps the uncounted requeues of one job (P6).
	MaxWorkerLost int
	// Retention is how long an ended job keeps its bulky detail before the
	// reaper reclaims it (P8); negative never reclaims.
	Retention time.Duration

	// Metrics receives the server's series; nil means unregistered ones.
	Metrics *Metrics
}

// Server serves the worker API, the user API and the admin pages. It
// starts no goroutine: Handler only routes, and RunReaper runs on the
// caller's goroutine.
type Server struct {
	cfg Config
	log *slog.Logger
	// cop refuses a browser's cross-origin change to the user API and
	// the admin forms (CSRF); its zero configuration trusts no other origin.
	cop *http.CrossOriginProtection
	// hosts remembers host tokens the store accepted (HostTokenCache).
	hosts hostCache
	// owners remembers which host holds a batch item's attempt (workerbatch.go).
	owners ownerCache
}

// New returns a server for cfg with its defaults filled in.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	setDefault(&cfg.LeaseTTL, DefaultLeaseTTL)
	setDefault(&cfg.MinLeaseTTL, DefaultMinLeaseTTL)
	setDefault(&cfg.MaxLeaseTTL, DefaultMaxLeaseTTL)
	setDefault(&cfg.ClaimWaitMax, DefaultClaimWaitMax)
	setDefault(&cfg.ClaimRecheck, DefaultClaimRecheck)
	setDefault(&cfg.ReaperInterval, DefaultReaperInterval)
	setDefault(&cfg.ReaperGrace, DefaultReaperGrace)
	if cfg.Retention == 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.MaxWorkerLost == 0 {
		cfg.MaxWorkerLost = DefaultMaxWorkerLost
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, cop: http.NewCrossOriginProtection()}
	cfg.Metrics.server.CompareAndSwap(nil, s) // the first server of these metrics shows its store
	return s
}

func setDefault(d *time.Duration, def time.Duration) {
	if *d <= 0 {
		*d = def
	}
}

// Handler returns the server's routes, timed and counted by Config.Metrics.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()

	// Probes: no token, nothing but a word.
	mux.HandleFunc("GET /healthz", s.handleHealthz)
	mux.HandleFunc("GET /readyz", s.handleReadyz)

	// Registration: a registration token buys a host its own token.
	mux.HandleFunc("POST "+wire.PathRegister, s.handleRegister)

	// Worker API, host scope.
	mux.HandleFunc("POST "+wire.PathClaim, s.handleClaim)
	mux.HandleFunc("POST "+wire.PathHostHeartbeat, s.handleHostHeartbeat)
	mux.HandleFunc("POST "+wire.PathConversations, s.handleConversationStates)
	mux.HandleFunc("POST "+wire.PathCancels, s.handleCancels)

	// Worker API, attempt scope.
	job := func(op string) string { return "POST " + wire.AttemptPath("{job}", op) }
	for op, h := range s.attemptHandlers() {
		mux.HandleFunc(job(op), h)
	}
	mux.HandleFunc(job(wire.OpPermissions), s.handlePermissionAnswer)
	// Many of the above of one host's attempts in one request (workerbatch.go).
	mux.HandleFunc("POST "+wire.PathWorkerBatch, s.handleWorkerBatch)

	// User API.
	mux.HandleFunc("POST /v1/conversations", s.user(s.handleCreateConversation))
	mux.HandleFunc("GET /v1/conversations", s.user(s.handleListConversations))
	mux.HandleFunc("GET /v1/conversations/{id}", s.user(s.handleGetConversation))
	mux.HandleFunc("DELETE /v1/conversations/{id}", s.user(s.handleDeleteConversation))
	mux.HandleFunc("POST /v1/conversations/{id}/messages", s.user(s.handleSendMessage))
	mux.HandleFunc("GET /v1/jobs", s.user(s.handleListJobs))
	mux.HandleFunc("GET /v1/jobs/{id}", s.user(s.handleGetJob))
	mux.HandleFunc("GET /v1/jobs/{id}/events", s.user(s.handleJobEvents))
	mux.HandleFunc("POST /v1/jobs/{id}/cancel", s.user(s.handleCancelJob))
	mux.HandleFunc("POST /v1/jobs/{id}/permissions/{request}", s.user(s.handlePermit))
	mux.HandleFunc("GET /v1/admin/servers", s.user(s.handleServersJSON))
	mux.HandleFunc("GET "+PathAdminAudit, s.user(s.handleListAudit))
	mux.HandleFunc("POST /v1/admin/conversations/{id}/lose", s.user(s.handleLoseConversation))
	for _, action := range []string{"pause", "resume", "rotate-token", "remove"} {
		mux.HandleFunc("POST "+PathAdminHost+action, bearerOnly(s.user(s.handleHostAction(action))))
	}

	// Admin pages and their forms (admin.go).
	mux.Handle("GET /admin/{$}", http.RedirectHandler("/admin/servers", http.StatusSeeOther))
	mux.HandleFunc("GET /admin/servers", s.user(s.handleServersPage))
	mux.HandleFunc("GET /admin/jobs", s.user(s.handleJobsPage))
	mux.HandleFunc("GET /admin/jobs/{id}", s.user(s.handleJobPage))
	mux.HandleFunc("GET /admin/conversations", s.user(s.handleConversationsPage))
	mux.HandleFunc("GET /admin/conversations/{id}/lose", s.user(s.handleConfirmLosePage))
	mux.HandleFunc("GET /admin/audit", s.user(s.handleAuditPage))
	mux.HandleFunc("POST /admin/jobs/{id}/cancel", s.adminForm(s.handleCancelJobForm))
	mux.HandleFunc("POST /admin/jobs/{id}/permissions/{request}", s.adminForm(s.handlePermitForm))
	mux.HandleFunc("POST /admin/conversations/{id}/lose", s.adminForm(s.handleLoseConversationForm))
	mux.HandleFunc("POST /admin/servers/{name}/pause", s.adminForm(s.handleHostForm(true)))
	mux.HandleFunc("POST /admin/servers/{name}/resume", s.adminForm(s.handleHostForm(false)))

	// Every request no route takes: a path some route serves with another
	// method is 405 with the methods it takes (Allow); any other is 404.
	// Without this the catch-all would answer both 404.
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if allow := allowedMethods(mux, r); len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			writeError(w, errMethod)
			return
		}
		writeError(w, errNoRoute)
	})
	return s.cfg.Metrics.instrument(checkPaths(mux))
}

// allowedMethods lists the methods for which mux has a route of r's path
// other than the catch-all, as the mux itself would pick it.
func allowedMethods(mux *http.ServeMux, r *http.Request) []string {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := mux.Handler(probe); pattern != "" && pattern != "/" {
			allow = append(allow, m)
		}
	}
	return allow
}
