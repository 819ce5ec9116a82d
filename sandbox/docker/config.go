package docker

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/docker/docker/client"

	"github.com/runnerd/runnerd/sandbox"
)

// Defaults of Config's zero fields.
const (
	DefaultNetwork      = "none"
	DefaultPidsLimit    = 256
	DefaultMemoryBytes  = 2 << 30
	DefaultNanoCPUs     = 1_000_000_000 // one CPU
	DefaultTmpfsBytes   = 64 << 20
	DefaultStartTimeout = 15 * time.Second
	DefaultProbeTimeout = 5 * time.Second
	DefaultStopTimeout  = 10 * time.Second
	DefaultWorkspace    = "/workspace"
	// A container's log is capped: the engine's default json-file driver
	// keeps everything a supervisor ever printed.
	DefaultLogDriver   = "json-file"
	DefaultLogMaxBytes = 10 << 20 // per file
	DefaultLogMaxFiles = 3
)

// Pull policies (Config.Pull, `runnerd run --pull`): when the backend
// asks the engine to pull a conversation's image. The image is needed
// only to create a container; a retained container keeps its own.
const (
	PullNever   = "never"   // never pull: an image not on this host is unavailable
	PullMissing = "missing" // pull when the image is not on this host (default)
	PullAlways  = "always"  // pull before every container the backend creates
)

// Paths inside the container. The runnerd binary and the socket directory
// are ours; they sit under one directory no image is likely to use.
const (
	containerRunnerd   = "/.runnerd/bin/runnerd"
	containerSocketDir = "/.runnerd/run"
	containerStateDir  = "/.runnerd/state"
	socketName         = "supervisor.sock"
)

// Config configures the Docker backend. Zero fields mean the default; the
// security defaults are on unless a field turns one off.
type Config struct {
	// Engine is the Docker engine client (required). Build it in cmd with
	// EngineFromEnv, which negotiates the API version.
	Engine *client.Client
	// Host is this host's name (required). It is the runnerd.host label:
	// containers and volumes with another host's label are never touched.
	Host string
	// StateDir is the daemon's state directory (required). The backend
	// keeps one 0700 directory per conversation under StateDir/docker; its
	// run/ subdirectory is bind-mounted into the container for the
	// supervisor's socket.
	StateDir string
	// RunnerdPath is the host path of the static (CGO_ENABLED=0) runnerd
	// binary, bind-mounted read-only into every container as its init
	// (required; usually os.Executable() of the daemon).
	RunnerdPath string
	// SuperviseArgs are extra arguments for `runnerd supervise` after the
	// ones the backend sets (socket and workspace).
	SuperviseArgs []string

	// Pull is the pull policy: PullNever, PullMissing (default) or
	// PullAlways. Credentials come from the engine client's own
	// configuration, config.json in DOCKER_CONFIG or ~/.docker (its auths,
	// credsStore and credHelpers), read at each pull.
	Pull string

	// Network is the network mode: "none" (default), "bridge", "host" or a
	// user-defined network name. Preflight checks that it exists.
	Network string
	// User overrides the user the agents run as ("uid:gid" or a name the
	// image knows). Empty means the image's own USER, which is a non-root
	// user when the image declares one. For a non-root agent user the
	// container runs as root, so that its supervisor can keep its state
	// where the agent cannot write, and starts the agents as that user; a
	// root agent user (no USER in the image) runs the container as before,
	// state unprotected from the agent (docs/operations.md).
	User string
	// PidsLimit bounds the number of processes (default 256; negative
	// means unlimited).
	PidsLimit int64
	// MemoryBytes bounds memory (default 2 GiB; negative means unlimited).
	MemoryBytes int64
	// NanoCPUs bounds CPU in units of 1e-9 CPUs (default one CPU; negative
	// means unlimited).
	NanoCPUs int64
	// AllowNewPrivileges turns off no-new-privileges (default: on).
	AllowNewPrivileges bool
	// CapAdd names capabilities kept after dropping ALL (default: none).
	CapAdd []string
	// WritableRootFS turns off the read-only root filesystem (default:
	// read-only, with a tmpfs at /tmp), for agents that write outside the
	// workspace.
	WritableRootFS bool
	// TmpfsBytes sizes the /tmp tmpfs of a read-only root (default 64 MiB).
	TmpfsBytes int64
	// NoInit runs the supervisor as PID 1 itself instead of under the
	// engine's tiny init, which reaps orphaned grandchildren (default: init).
	NoInit bool
	// Workspace is the workspace volume's mount point (default /workspace).
	Workspace string
	// LogMaxBytes caps one file of the container's log (default 10 MiB) and
	// LogMaxFiles the number of files kept (default 3): the container
	// logs with the json-file driver, rotated at that size, so one
	// container's log never holds more than their product. A negative
	// LogMaxBytes leaves the container's log to the engine's own default
	// (daemon.json's log-driver and log-opts), unbounded unless the
	// operator configured it there.
	LogMaxBytes int64
	LogMaxFiles int

	// StartTimeout bounds starting a container until its supervisor
	// answers (default 15 s).
	StartTimeout time.Duration
	// ProbeTimeout bounds waiting for the supervisor of a running
	// container to answer; one that does not is taken for hung and its
	// container is restarted (default 5 s).
	ProbeTimeout time.Duration
	// StopTimeout is the grace between SIGTERM and SIGKILL when the backend
	// stops a container it removes (default 10 s).
	StopTimeout time.Duration
	// TeardownBudget is how long Stop and Remove have, from the stop's
	// request, for the engine to report the container stopped (Stop) or
	// gone (Remove) (S6); past it they return a *sandbox.TeardownIncomplete
	// naming the container. Default sandbox.DefaultTeardownBudget.
	TeardownBudget time.Duration

	// Logger receives the backend's records (default: discarded).
	Logger *slog.Logger
}

func (c Config) withDefaults() (Config, error) {
	var missing []error
	if c.Engine == nil {
		missing = append(missing, errors.New("Engine is required"))
	}
	if c.Host == "" {
		missing = append(missing, errors.New("Host is required"))
	}
	if c.StateDir == "" {
		missing = append(missing, errors.New("StateDir is required"))
	}
	if c.RunnerdPath == "" {
		missing = append(missing, errors.New("RunnerdPath is required"))
	} else if !filepath.IsAbs(c.RunnerdPath) {
		missing = append(missing, fmt.Errorf("RunnerdPath %q is not absolute", c.RunnerdPath))
	}
	if err := errors.Join(missing...); err != nil {
		return c, fmt.Errorf("docker backend config: %w", err)
	}
	switch c.Pull {
	case "":
		c.Pull = PullMissing
	case PullNever, PullMissing, PullAlways:
	default:
		return c, fmt.Errorf("docker backend config: Pull %q: want %s, %s or %s", c.Pull, PullNever, PullMissing, PullAlways)
	}
	if c.Network == "" {
		c.Network = DefaultNetwork
	}
	if c.PidsLimit == 0 {
		c.PidsLimit = DefaultPidsLimit
	}
	if c.MemoryBytes == 0 {
		c.MemoryBytes = DefaultMemoryBytes
	}
	if c.NanoCPUs == 0 {
		c.NanoCPUs = DefaultNanoCPUs
	}
	if c.TmpfsBytes == 0 {
		c.TmpfsBytes = DefaultTmpfsBytes
	}
	if c.Workspace == "" {
		c.Workspace = DefaultWorkspace
	}
	if c.LogMaxBytes == 0 {
		c.LogMaxBytes = DefaultLogMaxBytes
	}
	if c.LogMaxFiles == 0 {
		c.LogMaxFiles = DefaultLogMaxFiles
	}
	if c.LogMaxBytes > 0 && c.LogMaxFiles < 1 {
		return c, fmt.Errorf("docker backend config: LogMaxFiles %d: want at least 1", c.LogMaxFiles)
	}
	if c.StartTimeout == 0 {
		c.StartTimeout = DefaultStartTimeout
	}
	if c.ProbeTimeout == 0 {
		c.ProbeTimeout = DefaultProbeTimeout
	}
	if c.StopTimeout == 0 {
		c.StopTimeout = DefaultStopTimeout
	}
	if c.TeardownBudget <= 0 {
		c.TeardownBudget = sandbox.DefaultTeardownBudget
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// EngineFromEnv builds an engine client from the DOCKER_* environment with
// API version negotiation (engines as old as 20.10, API 1.41, are fine).
// Only cmd calls it; tests do too.
func EngineFromEnv() (*client.Client, error) {
	return client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
}

// ensureDir makes dir (and parents) with mode perm and checks that it is a
// directory, not a symlink planted in its place.
func ensureDir(dir string, perm os.FileMode) error {
	if err := os.MkdirAll(dir, perm); err != nil {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	return os.Chmod(dir, perm)
}
