package fleet

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ControlPlaneConfig configures `controlplane serve`. Zero durations leave
// the server's defaults.
type ControlPlaneConfig struct {
	Bin     string // the controlplane executable; required
	DataDir string // SQLite database and user token; required
	// DB is --db (postgres://…); "" is SQLite in DataDir.
	DB string
	// Wrap is run before Bin, as in ip netns exec NS: it must exec Bin
	// in its own process, so that the pid stays the server's.
	Wrap []string
	// Listen is the address to serve on; default 127.0.0.1:0, a free port.
	Listen         string
	LeaseTTL       time.Duration
	MinLeaseTTL    time.Duration
	ReaperInterval time.Duration
	ReaperGrace    time.Duration
	ClaimWaitMax   time.Duration
	MaxWorkerLost  int
	ReleaseBackoff time.Duration // --release-backoff (K7)
	// Args are appended to serve's command line (--tls-cert …).
	Args []string
	// ClientTLS is what User trusts of an https:// server; nil: Go's defaults.
	ClientTLS *tls.Config
	// Log receives the server's output; nil discards it.
	Log io.Writer
	// StartTimeout bounds the wait for "serving"; default 20 s.
	StartTimeout time.Duration
}

// ControlPlane is a running `controlplane serve`.
type ControlPlane struct {
	*Process
	cfg ControlPlaneConfig
	// URL is the base address, e.g. http://127.0.0.1:40123.
	URL string
	// User speaks the user API with the server's user token.
	User *User
}

var servingLine = regexp.MustCompile(`serving (https?://\S+) on `)

// StartControlPlane starts the server and waits until it serves.
func StartControlPlane(ctx context.Context, cfg ControlPlaneConfig) (*ControlPlane, error) {
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 20 * time.Second
	}
	args := []string{"serve", "--data-dir", cfg.DataDir, "--listen", cfg.Listen}
	if cfg.DB != "" {
		args = append(args, "--db", cfg.DB)
	}
	args = appendDur(args, "--lease-ttl", cfg.LeaseTTL)
	args = appendDur(args, "--min-lease-ttl", cfg.MinLeaseTTL)
	args = appendDur(args, "--reaper-interval", cfg.ReaperInterval)
	args = appendDur(args, "--reaper-grace", cfg.ReaperGrace)
	args = appendDur(args, "--claim-wait-max", cfg.ClaimWaitMax)
	args = appendDur(args, "--release-backoff", cfg.ReleaseBackoff)
	if cfg.MaxWorkerLost > 0 {
		args = append(args, "--max-worker-lost", fmt.Sprint(cfg.MaxWorkerLost))
	}
	args = append(args, cfg.Args...)
	cmd := wrapped(cfg.Wrap, cfg.Bin, args)
	p, out, err := startWatched("controlplane", cmd, cfg.Log)
	if err != nil {
		return nil, err
	}
	m, err := out.await(0, servingLine, cfg.StartTimeout)
	if err != nil {
		_ = p.Stop(syscall.SIGKILL, time.Second)
		return nil, fmt.Errorf("controlplane serve: %w\n%s", err, out.text())
	}
	tok, err := os.ReadFile(filepath.Join(cfg.DataDir, "user-token"))
	if err != nil {
		_ = p.Stop(syscall.SIGKILL, time.Second)
		return nil, fmt.Errorf("controlplane serve: read the user token: %w", err)
	}
	url := m[1]
	return &ControlPlane{Process: p, cfg: cfg, URL: url, User: newUser(url, strings.TrimSpace(string(tok)), cfg.ClientTLS)}, nil
}

// Config is the configuration the server was started with, to start it
// again (give Listen the old address to keep it).
func (c *ControlPlane) Config() ControlPlaneConfig { return c.cfg }

// AddHost registers a host with `controlplane host add` on the same
// database and returns the path of its new token file (0600).
func (c *ControlPlane) AddHost(ctx context.Context, name string) (tokenFile string, err error) {
	tokenFile = filepath.Join(c.cfg.DataDir, "host-"+name+".token")
	args := []string{"host", "add", name, "--data-dir", c.cfg.DataDir, "--token-file", tokenFile}
	if c.cfg.DB != "" {
		args = append(args, "--db", c.cfg.DB)
	}
	cmd := exec.CommandContext(ctx, c.cfg.Bin, args...)
	cmd.Env = cleanEnv(nil)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("controlplane host add %s: %w\n%s", name, err, out)
	}
	return tokenFile, nil
}

// RegistrationToken makes a registration token with `controlplane
// registration-token create` on the same database, for maxUses hosts (0:
// no limit), and returns the path of its new file (0600): what a daemon
// registers itself with (runnerd run --registration-token-file).
func (c *ControlPlane) RegistrationToken(ctx context.Context, name string, maxUses int) (tokenFile string, err error) {
	tokenFile = filepath.Join(c.cfg.DataDir, "registration-"+name+".token")
	args := []string{"registration-token", "create", name, "--data-dir", c.cfg.DataDir, "--token-file", tokenFile,
		"--max-uses", strconv.Itoa(maxUses)}
	if c.cfg.DB != "" {
		args = append(args, "--db", c.cfg.DB)
	}
	cmd := exec.CommandContext(ctx, c.cfg.Bin, args...)
	cmd.Env = cleanEnv(nil)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("controlplane registration-token create %s: %w\n%s", name, err, out)
	}
	return tokenFile, nil
}

func appendDur(args []string, flag string, d time.Duration) []string {
	if d <= 0 {
		return args
	}
	return append(args, flag, d.String())
}

// wrapped is the command bin args, run through wrap (ip netns exec NS)
// if given, with a clean environment.
func wrapped(wrap []string, bin string, args []string) *exec.Cmd {
	argv := append(append(append([]string{}, wrap...), bin), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = cleanEnv(nil)
	return cmd
}

// cleanEnv is the environment of a child: PATH and HOME of ours, no
// RUNNERD_* or systemd variable that could change its configuration
// behind the flags, then extra.
func cleanEnv(extra []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "PATH", "HOME", "TMPDIR", "LANG":
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}
