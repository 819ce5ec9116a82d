package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore"
	"github.com/runnerd/runnerd/internal/tlsfiles"
)

// shutdownGrace bounds the wait for requests in flight after a signal.
const shutdownGrace = 10 * time.Second

// dbFlags are the flags that say where the database is, shared by serve
// and host add.
type dbFlags struct {
	db, dataDir, sync string
}

func addDBFlags(f *flags) *dbFlags {
	d := &dbFlags{}
	f.fs.StringVar(&d.dataDir, "data-dir", "data", "directory for the SQLite database and the user token")
	f.fs.StringVar(&d.db, "db", "", "database: sqlite:PATH or postgres://… (default sqlite:DATA-DIR/controlplane.db)")
	f.fs.StringVar(&d.sync, "sqlite-synchronous", "full", "SQLite synchronous level: full (every acknowledged write survives power loss) or normal (the last writes may roll back on power loss: only by choice)")
	return d
}

// check validates the flags before anything is opened.
func (d *dbFlags) check() error {
	if d.dataDir == "" {
		return usagef("--data-dir must not be empty")
	}
	switch strings.ToLower(d.sync) {
	case "normal", "full":
	default:
		return usagef("--sqlite-synchronous must be normal or full, not %q", d.sync)
	}
	switch {
	case d.db == "":
		d.db = "sqlite:" + filepath.Join(d.dataDir, "controlplane.db")
	case strings.HasPrefix(d.db, "sqlite:"):
		if strings.TrimPrefix(d.db, "sqlite:") == "" {
			return usagef("--db sqlite: needs a path, as in sqlite:data/controlplane.db")
		}
	case strings.HasPrefix(d.db, "postgres://"), strings.HasPrefix(d.db, "postgresql://"):
	default:
		return usagef("--db must be sqlite:PATH or postgres://…")
	}
	return nil
}

// synchronous is SQLite's level: FULL unless normal was asked for (K9).
func (d *dbFlags) synchronous() sqlstore.Synchronous {
	if strings.EqualFold(d.sync, "normal") {
		return sqlstore.SyncNormal
	}
	return sqlstore.SyncFull
}

// create opens the store with opts, creating an SQLite database that is
// not there yet (serve); where names it for people without a password.
func (d *dbFlags) create(ctx context.Context, opts ...sqlstore.Option) (st *sqlstore.Store, where string, err error) {
	return d.openStore(ctx, true, opts...)
}

// open opens an existing store for a command that reads or changes it
// (host add, token): an SQLite database that is not there is a mistake in
// the flags or the working directory, refused, never made empty.
func (d *dbFlags) open(ctx context.Context, opts ...sqlstore.Option) (st *sqlstore.Store, where string, err error) {
	return d.openStore(ctx, false, opts...)
}

func (d *dbFlags) openStore(ctx context.Context, create bool, opts ...sqlstore.Option) (st *sqlstore.Store, where string, err error) {
	if path, ok := strings.CutPrefix(d.db, "sqlite:"); ok {
		if _, err := os.Stat(path); !create && errors.Is(err, fs.ErrNotExist) {
			return nil, "", usagef("no database at sqlite:%s: \"controlplane serve\" creates it on its first start; name another with --db or --data-dir", path)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, "", fmt.Errorf("create the database directory: %w", err)
		}
		st, err = sqlstore.OpenSQLite(ctx, path, append(opts, sqlstore.WithSynchronous(d.synchronous()))...)
		return st, "sqlite:" + path, err
	}
	st, err = sqlstore.OpenPostgres(ctx, d.db, opts...)
	return st, "postgres", err
}

func serve(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	f := newFlags("serve", stderr)
	d := addDBFlags(f)
	listen := f.fs.String("listen", "127.0.0.1:8080", "address to serve HTTP on")
	tokenFile := f.fs.String("user-token-file", "", "file of the user API's bearer token, created 0600 on first start (default DATA-DIR/user-token)")
	leaseTTL := f.fs.Duration("lease-ttl", controlplane.DefaultLeaseTTL, "lease of a claim or renewal that asks for none")
	minLeaseTTL := f.fs.Duration("min-lease-ttl", controlplane.DefaultMinLeaseTTL, "shortest lease a runner may ask for: one renewal interval plus one request timeout (lower only for tests)")
	maxLeaseTTL := f.fs.Duration("max-lease-ttl", controlplane.DefaultMaxLeaseTTL, "longest lease a runner may ask for")
	claimWait := f.fs.Duration("claim-wait-max", controlplane.DefaultClaimWaitMax, "longest hold of a claim or event long poll")
	claimRecheck := f.fs.Duration("claim-recheck", controlplane.DefaultClaimRecheck, "how often a waiting claim asks the store again without its signal of new work (for what no signal announces: a release backoff that ended)")
	reaperInterval := f.fs.Duration("reaper-interval", controlplane.DefaultReaperInterval, "period of the reaper's sweep")
	reaperGrace := f.fs.Duration("reaper-grace", controlplane.DefaultReaperGrace, "time past a lease's expiry before its attempt is superseded; at least the runner's stop grace")
	maxWorkerLost := f.fs.Int("max-worker-lost", controlplane.DefaultMaxWorkerLost, "host losses a job may suffer before it fails instead of being queued again")
	maxReleases := f.fs.Int("max-releases", store.DefaultMaxReleases, "releases and declines of a job (its turn never started on a host) that queue it again; the next one fails it, with the last decline's class as its reason (K7)")
	releaseBackoff := f.fs.Duration("release-backoff", store.DefaultReleaseBackoff, "how long a released job waits before any host is given it again; doubles with each release, at most a minute (K7)")
	retention := f.fs.Duration("retention", controlplane.DefaultRetention, "how long an ended job keeps its prompt, credentials and runner payloads before the reaper reclaims them; 0 keeps them for ever")
	logLevel := f.fs.String("log-level", "info", "debug, info, warn or error")
	logFormat := f.fs.String("log-format", "text", "records as text (people) or json (journald, collectors)")
	tlsCert := f.fs.String("tls-cert", "", "PEM certificate (chain) to serve HTTPS with, beside --tls-key; read again on SIGHUP, without dropping connections")
	tlsKey := f.fs.String("tls-key", "", "PEM private key of --tls-cert")
	clientCA := f.fs.String("client-ca", "", "PEM CA file: require every client (runnerd --tls-client-cert) to show a certificate it signed (mTLS); needs --tls-cert")
	if err := f.parse(args); err != nil {
		return err
	}
	if f.fs.NArg() > 0 {
		return usagef("unexpected argument %q", f.fs.Arg(0))
	}
	if err := d.check(); err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return usagef("--log-level must be debug, info, warn or error, not %q", *logLevel)
	}
	switch {
	case *logFormat != "text" && *logFormat != "json":
		return usagef("--log-format must be text or json, not %q", *logFormat)
	case *listen == "":
		return usagef("--listen must not be empty")
	case *minLeaseTTL <= 0:
		return usagef("--min-lease-ttl must be positive")
	case *maxLeaseTTL < *minLeaseTTL:
		return usagef("--max-lease-ttl %v is shorter than --min-lease-ttl %v", *maxLeaseTTL, *minLeaseTTL)
	case *leaseTTL < *minLeaseTTL || *leaseTTL > *maxLeaseTTL:
		return usagef("--lease-ttl %v must be between --min-lease-ttl %v (one renewal interval plus one request timeout) and --max-lease-ttl %v",
			*leaseTTL, *minLeaseTTL, *maxLeaseTTL)
	case *claimWait <= 0 || *claimRecheck <= 0 || *reaperInterval <= 0 || *reaperGrace <= 0:
		return usagef("--claim-wait-max, --claim-recheck, --reaper-interval and --reaper-grace must be positive")
	case *maxWorkerLost < 1:
		return usagef("--max-worker-lost must be at least 1")
	case *maxReleases < 1:
		return usagef("--max-releases must be at least 1")
	case *releaseBackoff <= 0:
		return usagef("--release-backoff must be positive")
	case *retention < 0:
		return usagef("--retention must not be negative (0 keeps detail for ever)")
	}
	if *retention == 0 {
		*retention = -1 // Config: negative never reclaims, zero is the default
	}
	if *tokenFile == "" {
		*tokenFile = filepath.Join(d.dataDir, "user-token")
	}
	var certs *tlsfiles.Server // nil: plain HTTP
	if *tlsCert != "" || *tlsKey != "" || *clientCA != "" {
		var err error
		if certs, err = tlsfiles.NewServer(*tlsCert, *tlsKey, *clientCA); err != nil {
			return usagef("%v", err)
		}
	}

	var h slog.Handler = slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})
	if *logFormat == "json" {
		h = slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level})
	}
	log := slog.New(h)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "controlplane_build_info", Help: "Always 1; the labels name the build.",
			ConstLabels: prometheus.Labels{"version": version, "goversion": runtime.Version()},
		}, func() float64 { return 1 }))
	metrics := controlplane.NewMetrics(reg)
	if err := os.MkdirAll(d.dataDir, 0o700); err != nil {
		return fmt.Errorf("create the data directory: %w", err)
	}
	st, where, err := d.create(ctx, sqlstore.WithMaxReleases(*maxReleases), sqlstore.WithReleaseBackoff(*releaseBackoff), sqlstore.WithMaxWorkerLost(*maxWorkerLost),
		sqlstore.WithTxObserver(metrics.ObserveTx), sqlstore.WithWorkListenObserver(controlplane.WorkListenObserver(log)))
	if err != nil {
		return err
	}
	defer st.Close()
	// K9 as the writer's connection has it, not as it was asked for.
	durability, err := st.WriterSynchronous(ctx)
	if err != nil {
		return err
	}
	if durability != "" {
		where += " (synchronous=" + strings.ToLower(string(durability)) + ")"
	}
	tokenNote, err := userTokenFile(ctx, st, *tokenFile)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *listen, err)
	}

	srv := controlplane.New(controlplane.Config{
		Store: st, Logger: log, LeaseTTL: *leaseTTL, MinLeaseTTL: *minLeaseTTL, MaxLeaseTTL: *maxLeaseTTL, ClaimWaitMax: *claimWait, ClaimRecheck: *claimRecheck,
		ReaperInterval: *reaperInterval, ReaperGrace: *reaperGrace, MaxWorkerLost: *maxWorkerLost, Retention: *retention,
		Metrics: metrics,
	})
	// /metrics is not authenticated, as Prometheus scrapes expect: it
	// shows counts and states, never a name, an id or a token.
	// Not a second ServeMux: one in front of the server's would answer a
	// path it finds unclean with its own redirect (307, no JSON body)
	// before the server could refuse it as the protocol says.
	metricsPage, api := promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), srv.Handler()
	hs := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/metrics" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
				metricsPage.ServeHTTP(w, r)
				return
			}
			api.ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		WriteTimeout:      *claimWait + time.Minute, // long polls hold their answer up to claimWait
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		// A signal ends every long poll at once (they answer "nothing yet").
		BaseContext: func(net.Listener) context.Context { return ctx },
	}

	scheme := "http"
	if certs != nil {
		scheme = "https"
		hs.TLSConfig = certs.Config()
		// SIGHUP reads the pair again: each new handshake gets the new one,
		// connections already made keep theirs; a bad pair keeps the old.
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		go reloadOnHangup(ctx, hup, certs, log)
	}

	fmt.Fprintf(stderr, "controlplane %s: serving %s://%s on %s\n", version, scheme, ln.Addr(), where)
	fmt.Fprintf(stderr, "controlplane: %s\n", tokenNote)
	fmt.Fprintf(stderr, "controlplane: admin page %s://%s/admin/servers (any user name, the token as password)\n", scheme, ln.Addr())

	// P4, K3: leases that expired while the control plane was away are
	// resumed before the first request is accepted.
	if err := srv.Resume(ctx); err != nil {
		return fmt.Errorf("resume leases after an absence: %w", err)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	served := make(chan error, 1)
	reapCtx, stopReaper := context.WithCancel(ctx)
	defer stopReaper()
	go func() {
		defer wg.Done()
		srv.RunReaper(reapCtx)
	}()
	go func() {
		defer wg.Done()
		if certs != nil {
			served <- hs.ServeTLS(ln, "", "") // the pair comes from TLSConfig.GetCertificate
			return
		}
		served <- hs.Serve(ln)
	}()

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-served:
	}
	log.Info(controlplane.MsgStopping)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		hs.Close()
	}
	if serveErr == nil {
		serveErr = <-served
	}
	stopReaper()
	wg.Wait()
	if ctx.Err() == nil || !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", serveErr)
	}
	fmt.Fprintln(stderr, "controlplane: stopped")
	return nil
}

// reloadOnHangup reads the TLS pair again at each SIGHUP and says how it
// went: the new certificate's expiry, or why the old one stays.
func reloadOnHangup(ctx context.Context, hup <-chan os.Signal, certs *tlsfiles.Server, log *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			if err := certs.Reload(); err != nil {
				log.LogAttrs(ctx, slog.LevelError, controlplane.MsgTLSReloadFailed, slog.String("reason", err.Error()),
					slog.Time("kept_not_after", certs.Leaf().NotAfter))
				continue
			}
			log.LogAttrs(ctx, slog.LevelInfo, controlplane.MsgTLSReloaded, slog.String("subject", certs.Leaf().Subject.CommonName),
				slog.Time("not_after", certs.Leaf().NotAfter))
		}
	}
}

// userTokenFile keeps the one-machine case working with user tokens that
// live in the database (docs/operations.md): on the first start of a
// database it creates a user token, writes it to path (0600, never
// overwriting) and stores its hash; a file from before (an upgrade) is
// registered once. A replica that finds tokens in the database and no file
// writes none. It returns the line serve prints about it, which never
// holds the token.
func userTokenFile(ctx context.Context, st store.Store, path string) (note string, err error) {
	token, err := readSecret(path, "the user token")
	if errors.Is(err, fs.ErrNotExist) {
		have, err := st.ListUserTokens(ctx)
		if err != nil {
			return "", fmt.Errorf("read the user tokens: %w", err)
		}
		if len(have) > 0 {
			return "user tokens are in the database; no token file here (controlplane token create makes one)", nil
		}
		token = controlplane.NewToken(controlplane.UserTokenPrefix)
		// Written before the token is stored, so that a token that could
		// not be kept never works; removed again if it cannot be stored.
		if err := writeSecret(path, token+"\n"); err != nil {
			return "", fmt.Errorf("create the user token: %w", err)
		}
		if _, err := st.CreateUserToken(ctx, "first start", controlplane.HashToken(token), cliAudit("first start: no user token yet"), time.Now()); err != nil {
			_ = os.Remove(path)
			return "", fmt.Errorf("create the user token: %w", err)
		}
		return "user API token created in " + path + " (send it as Authorization: Bearer …)", nil
	}
	if err != nil {
		return "", err
	}
	t, err := st.UserTokenByHash(ctx, controlplane.HashToken(token))
	switch {
	case errors.Is(err, store.ErrUnauthorized):
		if _, err := st.CreateUserToken(ctx, "file "+path, controlplane.HashToken(token), cliAudit("the token file "+path+" is kept in the database"), time.Now()); err != nil && !errors.Is(err, store.ErrExists) {
			return "", fmt.Errorf("register the user token of %s: %w", path, err)
		}
		return "user API token in " + path + ", now kept in the database too (send it as Authorization: Bearer …)", nil
	case err != nil:
		return "", fmt.Errorf("read the user tokens: %w", err)
	case t.RevokedAt != nil:
		return "the user token in " + path + " was revoked (" + t.ID + "); create one with controlplane token create", nil
	}
	return "user API token in " + path + " (send it as Authorization: Bearer …)", nil
}

// readSecret reads a token from a file only its owner may read; what
// names it in errors.
func readSecret(path, what string) (string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	if err != nil {
		return "", fmt.Errorf("read %s: %w", what, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", what, err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("the file %s of %s has mode %04o; others may read it: chmod 600 it", path, what, fi.Mode().Perm())
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		return "", fmt.Errorf("the file %s of %s is empty", path, what)
	}
	return token, nil
}

// writeSecret creates path 0600 with content; it never replaces a file.
func writeSecret(path, content string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	return f.Close()
}
