// Command runnerd is the sandbox host agent. One executable, three roles,
// chosen by the first argument before anything else happens:
//
//	runnerd run        the host daemon (package runner)
//	runnerd turn       one turn's child, started by the daemon with fd 3 (runner/turn)
//	runnerd supervise  a sandbox's manager (sandbox/supervisor)
//	runnerd drain      asks the daemon to drain, and waits for it to exit (drain.go)
//	runnerd version    the version (also `runnerd run --version`)
//
// With the process backend the daemon starts the last two from
// runnerd-child instead, when it lies beside this executable (child.go).
// Only this file, config.go and cmd/internal/child read flags and the
// environment, install signal handlers and call os.Exit.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/runnerd/runnerd/cmd/internal/child"
	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/internal/sdscope"
	"github.com/runnerd/runnerd/runner"
	"github.com/runnerd/runnerd/runner/turn"
	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/docker"
	"github.com/runnerd/runnerd/wire"
)

// version is set at build time (-X main.version=…).
var version = "dev"

const usage = "usage: runnerd run [flags] | runnerd drain [--state-dir DIR] | runnerd turn | runnerd supervise [flags] | runnerd version"

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	switch os.Args[1] {
	case "turn":
		os.Exit(child.Turn(openBackend))
	case "supervise":
		os.Exit(child.Supervise(os.Args[2:]))
	case "run":
		os.Exit(runDaemon(os.Args[2:], os.Getenv, os.Stdout, os.Stderr))
	case "drain":
		os.Exit(runDrain(os.Args[2:], os.Getenv, os.Stdout, os.Stderr))
	default:
		os.Exit(answer(os.Args[1], os.Stdout, os.Stderr))
	}
}

// answer is runnerd with an argument that is no role: the version and the
// help exit 0, anything else is the usage and 2.
func answer(arg string, stdout, stderr io.Writer) int {
	switch arg {
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, "runnerd", version)
	case "help", "-h", "-help", "--help":
		fmt.Fprintln(stdout, usage)
		fmt.Fprintln(stdout, `Run "runnerd run --help" for the daemon's flags.`)
	default:
		fmt.Fprintln(stderr, usage)
		return 2
	}
	return 0
}

// exitHostTokenRefused is `runnerd run`'s status when the control plane
// refused the host token or its registration: a unit can keep systemd from restarting it in a
// loop with RestartPreventExitStatus=3.
const exitHostTokenRefused = 3

// runDaemon is `runnerd run`. Bad configuration is one line on stderr and
// exit status 2; a failure to start is one line and status 1.
func runDaemon(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	o, err := parseRun(args, getenv)
	if he := (*helpError)(nil); errors.As(err, &he) {
		fmt.Fprint(stdout, he.usage)
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "runnerd: "+err.Error())
		return 2
	}
	if o.version {
		fmt.Fprintln(stdout, "runnerd", version)
		return 0
	}
	level, _ := parseLevel(o.logLevel)
	var h slog.Handler = slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level})
	if o.logFormat == "text" {
		h = slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})
	}
	log := slog.New(h)
	rec := diagnostics.NewRecorder(log)
	for _, w := range o.warnings {
		rec.ConfigIgnored(context.Background(), w.Setting, w.Given, w.Used, w.Reason)
	}

	cfg := o.cfg
	cfg.Logger = log
	cfg.Version = version
	cfg.ChildStderr = stderr
	cfg.RenewHTTP.Proxy = http.ProxyFromEnvironment // as for every other control request
	cfg.HostTokenFile = o.tokenFile
	if _, statErr := os.Stat(o.tokenFile); o.regFile != "" && errors.Is(statErr, os.ErrNotExist) {
		// A first start: Run registers the host and keeps its token there.
		cfg.RegistrationToken, err = readSecretFile(o.regFile, "--registration-token-file", getenv("CREDENTIALS_DIRECTORY"), log)
	} else {
		cfg.HostToken, err = readToken(o.tokenFile, getenv("CREDENTIALS_DIRECTORY"), log)
	}
	if err != nil {
		fmt.Fprintln(stderr, "runnerd: "+err.Error())
		return 2
	}
	if cfg.Executable, err = os.Executable(); err != nil {
		fmt.Fprintln(stderr, "runnerd: cannot find its own executable: "+err.Error())
		return 1
	}
	if cfg.Sandbox == sandbox.BackendProcess {
		var why string
		cfg.Executable, why = childExecutable(cfg.Executable)
		log.Info(runner.MsgTurnExecutable, slog.String("path", cfg.Executable), slog.String("reason", why))
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		fmt.Fprintln(stderr, "runnerd: --state-dir: "+err.Error())
		return 1
	}
	if cfg.Backend, err = backend(cfg); err != nil {
		fmt.Fprintln(stderr, "runnerd: "+err.Error())
		return 1
	}
	cfg.DiskPaths = diskPaths(cfg, log)

	// systemd: NOTIFY_SOCKET set means Type=notify; WATCHDOG_USEC sets the pace.
	if getenv("NOTIFY_SOCKET") != "" {
		cfg.Notifier = sdNotifier{}
		cfg.WatchdogInterval = o.watchdog
		if wd, err := daemon.SdWatchdogEnabled(false); err == nil && wd > 0 {
			cfg.WatchdogInterval = wd / 2
		}
	}

	// Under systemd each turn child goes into a transient scope of its own,
	// so that `systemctl restart runnerd` does not kill it; elsewhere the
	// children stay in the daemon's cgroup (runnerd_turn_scopes says which).
	cfg.CgroupHierarchy = sdscope.Hierarchy()
	if scopes, why := sdscope.Detect(context.Background(), getenv); scopes != nil {
		defer scopes.Close()
		cfg.Scopes = scopes
	} else {
		cfg.ScopesOff = why
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "runnerd_build_info", Help: "Always 1; the labels name the build.",
			ConstLabels: prometheus.Labels{"version": version, "goversion": runtime.Version()},
		}, func() float64 { return 1 }))
	cfg.Metrics = runner.NewMetrics(reg)

	d, err := runner.New(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "runnerd: "+err.Error())
		return 2
	}
	removePid, err := writePidFile(cfg.StateDir)
	if err != nil {
		fmt.Fprintln(stderr, "runnerd: "+err.Error())
		return 1
	}
	defer removePid()

	var metricsSrv *http.Server
	metricsDone := make(chan struct{})
	if o.metricsListen != "" {
		l, err := net.Listen("tcp", o.metricsListen)
		if err != nil {
			fmt.Fprintln(stderr, "runnerd: --listen-metrics: "+err.Error())
			return 1
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.Handle("GET /healthz", runner.ProbeHandler(d.Liveness)) // the loops check in: a liveness probe
		mux.Handle("GET /readyz", runner.ProbeHandler(d.Readiness)) // reachable and claiming: a readiness probe
		metricsSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			defer close(metricsDone)
			_ = metricsSrv.Serve(l)
		}()
		log.Info(runner.MsgMetricsListening, slog.String("addr", l.Addr().String()))
	} else {
		close(metricsDone)
	}

	// SIGTERM or SIGINT hands the running turns over to the next start and
	// exits within seconds: a restart or an upgrade keeps every turn (P5).
	// SIGUSR1 drains, to take the host out of service (`runnerd drain`); a
	// second SIGUSR1 stops the turns a drain still waits for. A SIGHUP only
	// leaves a record (K11).
	ctx, handover := context.WithCancel(context.Background())
	defer handover()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1, syscall.SIGHUP)
	defer signal.Stop(sigs)
	sigDone := make(chan struct{})
	go func() {
		defer close(sigDone)
		drains := 0
		for {
			select {
			case sig := <-sigs:
				switch sig {
				case syscall.SIGHUP:
					d.Hangup()
				case syscall.SIGUSR1:
					if drains++; drains == 1 {
						d.Drain()
					} else {
						d.EndDrain()
					}
				default:
					handover()
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()

	err = d.Run(ctx)
	handover()
	<-sigDone
	if metricsSrv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = metricsSrv.Shutdown(sctx)
		cancel()
	}
	<-metricsDone
	if se := (*wire.StatusError)(nil); errors.Is(err, runner.ErrRegistrationRefused) && errors.As(err, &se) {
		// The server's sentence says why (it holds no token); a restart
		// would be refused the same way.
		fmt.Fprintf(stderr, "runnerd: the control plane refused to register host %s (%d %s): %s\n", cfg.HostName, se.Status, se.Code, se.Message)
		return exitHostTokenRefused
	}
	if errors.Is(err, runner.ErrHostTokenRefused) {
		// runnerd_host_token_refused was written when it happened.
		fmt.Fprintf(stderr, "runnerd: the control plane refused the host token in %s; register the host again (controlplane host add or host rotate-token --grace 0) and put the new token there\n", o.tokenFile)
		return exitHostTokenRefused
	}
	if err != nil {
		fmt.Fprintln(stderr, "runnerd: "+err.Error())
		return 1
	}
	return 0
}

// readToken reads the host token file; its errors name the path. A file others can read gets a
// warning record (never the token), unless it is a systemd credential
// (LoadCredential=, deploy/runnerd.service): a file directly in credDir,
// $CREDENTIALS_DIRECTORY, which systemd keeps 0440 on a mount only this
// service can reach.
func readToken(path, credDir string, log *slog.Logger) (string, error) {
	return readSecretFile(path, "--host-token-file", credDir, log)
}

// readSecretFile is readToken of the file of flag.
func readSecretFile(path, flag, credDir string, log *slog.Logger) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", flag, path, errors.Unwrap(err))
	}
	credential := credDir != "" && filepath.Dir(filepath.Clean(path)) == filepath.Clean(credDir)
	if fi.Mode().Perm()&0o077 != 0 && !credential {
		log.Warn(runner.MsgTokenFileMode, slog.String("mode", fi.Mode().Perm().String()), slog.String("want", "-rw-------"))
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", flag, path, errors.Unwrap(err))
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" || strings.ContainsAny(tok, " \t\r\n") {
		return "", errors.New(flag + ": the file must hold one token on one line")
	}
	return tok, nil
}

// backend is the daemon's own handle on the sandboxes, built like the
// turn children's, used to remove a LOST conversation's sandbox.
func backend(cfg runner.Config) (sandbox.Backend, error) {
	b, err := openBackend(turn.Sandbox{
		Backend:  cfg.Sandbox,
		StateDir: cfg.StateDir,
		HostName: cfg.HostName,
		Runnerd:  cfg.Executable,
		Docker:   cfg.Docker,
		// Only the daemon stops and removes sandboxes: the turn
		// children's payload leaves it out.
		TeardownBudget: cfg.TeardownBudget,
	}, cfg.Logger)
	if err != nil {
		return nil, fmt.Errorf("%s sandbox backend: %w", cfg.Sandbox, err)
	}
	return b, nil
}

// diskPaths are the filesystems --min-free-disk watches (S2): the state
// directory's and, for the docker backend, the engine's root, where
// containers' writable layers and volumes live. An engine that does not
// answer now leaves its root out, with a record.
func diskPaths(cfg runner.Config, log *slog.Logger) []string {
	paths := []string{cfg.StateDir}
	if cfg.Sandbox != sandbox.BackendDocker {
		return paths
	}
	engine, err := docker.EngineFromEnv()
	if err == nil {
		defer engine.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		info, ierr := engine.Info(ctx)
		if err = ierr; err == nil && info.DockerRootDir != "" {
			return append(paths, info.DockerRootDir)
		}
	}
	log.Warn(diagnostics.MsgSandboxPressureUnmeasured, slog.String(diagnostics.KeyPath, "docker_root"),
		slog.String(diagnostics.KeyClass, diagnostics.Class(err)))
	return paths
}

// sdNotifier is sd_notify through go-systemd; it reads NOTIFY_SOCKET itself.
type sdNotifier struct{}

func (sdNotifier) Notify(state string) error {
	ok, err := daemon.SdNotify(false, state)
	if err == nil && !ok {
		return errors.New("NOTIFY_SOCKET is not set")
	}
	return err
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("--log-level %q: want debug, info, warn or error", s)
	}
	return l, nil
}
