// Command skewcp is a control-plane replica whose own clock is off by a
// given offset, for the chaos campaign (integration/chaos) only. faketime
// cannot move a Go binary's clock, and the product has no flag for it, so
// this test-only main builds the same server as `controlplane serve` on
// PostgreSQL with controlplane.Config.Now skewed: whatever the replica
// reads off its own clock is minutes wrong, while the database's clock,
// on which leases are judged (K3), stays the one clock of the fleet. It
// takes the subset of serve's flags the campaign gives (the offset as
// --clock-offset or SKEWCP_CLOCK_OFFSET), and prints serve's
// "serving" line so that the harness finds its address the same way.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "skewcp:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "serve" {
		return errors.New("usage: skewcp serve --db postgres://… --clock-offset D [serve's flags]")
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.String("data-dir", "", "ignored: the user token is in the database")
	db := fs.String("db", "", "postgres://…")
	listen := fs.String("listen", "127.0.0.1:0", "address to serve on")
	var envOffset time.Duration
	if v := os.Getenv("SKEWCP_CLOCK_OFFSET"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("SKEWCP_CLOCK_OFFSET: %w", err)
		}
		envOffset = d
	}
	offset := fs.Duration("clock-offset", envOffset, "how far this replica's own clock is off (default SKEWCP_CLOCK_OFFSET)")
	leaseTTL := fs.Duration("lease-ttl", 0, "")
	minLeaseTTL := fs.Duration("min-lease-ttl", 0, "")
	claimWait := fs.Duration("claim-wait-max", 0, "")
	reaperInterval := fs.Duration("reaper-interval", 0, "")
	reaperGrace := fs.Duration("reaper-grace", 0, "")
	maxWorkerLost := fs.Int("max-worker-lost", controlplane.DefaultMaxWorkerLost, "")
	releaseBackoff := fs.Duration("release-backoff", store.DefaultReleaseBackoff, "")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *db == "" {
		return errors.New("--db is required")
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	st, err := sqlstore.OpenPostgres(ctx, *db, sqlstore.WithMaxWorkerLost(*maxWorkerLost), sqlstore.WithReleaseBackoff(*releaseBackoff))
	if err != nil {
		return err
	}
	defer st.Close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	skew := *offset
	srv := controlplane.New(controlplane.Config{
		Store: st, Logger: log, Now: func() time.Time { return time.Now().Add(skew) },
		LeaseTTL: *leaseTTL, MinLeaseTTL: *minLeaseTTL, ClaimWaitMax: *claimWait,
		ReaperInterval: *reaperInterval, ReaperGrace: *reaperGrace, MaxWorkerLost: *maxWorkerLost,
	})
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	fmt.Fprintf(os.Stderr, "controlplane skewcp: serving http://%s on postgres, own clock off by %v\n", ln.Addr(), skew)
	if err := srv.Resume(ctx); err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	reapCtx, stopReaper := context.WithCancel(ctx)
	reaped := make(chan struct{})
	go func() {
		defer close(reaped)
		_ = srv.RunReaper(reapCtx)
	}()
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-served:
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		hs.Close()
	}
	stopReaper()
	<-reaped
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return serveErr
	}
	return nil
}
