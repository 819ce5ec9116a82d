package docker_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"
	"go.uber.org/goleak"

	"github.com/runnerd/runnerd/sandbox/docker"
)

// The environment every Docker test shares, set up once by TestMain: the
// engine, the static runnerd binary to bind-mount, and an
// image built FROM scratch over the static agents.
var env struct {
	skip      string // why the Docker tests skip; "" when they run
	engine    *client.Client
	runnerd   string   // host path of the static supervisor binary
	image     string   // tag of the test image
	agent     []string // the demo agent's argv in the image
	hostAgent string   // host path of the same agent binary (process backend)
}

// built is what TestMain builds, handed to a test run again in a child
// process in envBuilt.
type built struct{ Runnerd, Image, HostAgent string }

const envBuilt = "RUNNERD_DOCKER_TEST_BUILT"

// Paths of the agents inside the test image.
const (
	imgDemoAgent = "/bin/demoagent"
	imgTestAgent = "/bin/testagent"
	imgUID       = "4242" // the image's user "agent"
)

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	eng, err := docker.EngineFromEnv()
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = eng.Ping(ctx)
		cancel()
	}
	if err != nil {
		if os.Getenv("RUNNERD_REQUIRE_DOCKER") == "1" {
			fmt.Fprintf(os.Stderr, "RUNNERD_REQUIRE_DOCKER=1 but no Docker engine is reachable: %v\n", err)
			return 1
		}
		env.skip = fmt.Sprintf("no Docker engine reachable (%v); set RUNNERD_REQUIRE_DOCKER=1 to make this a failure", err)
		return m.Run()
	}
	env.engine = eng

	// A test run again in a child process (under strace: stracetest) uses
	// what its parent built, which the parent removes.
	if shared := os.Getenv(envBuilt); shared != "" {
		var b built
		if err := json.Unmarshal([]byte(shared), &b); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", envBuilt, err)
			return 1
		}
		env.runnerd, env.image, env.hostAgent = b.Runnerd, b.Image, b.HostAgent
		env.agent = []string{imgDemoAgent}
		code := m.Run()
		eng.Close()
		return code
	}

	dir, err := os.MkdirTemp("", "runnerd-docker-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := setup(dir); err != nil {
		fmt.Fprintf(os.Stderr, "docker test setup: %v\n", err)
		return 1
	}
	shared, _ := json.Marshal(built{Runnerd: env.runnerd, Image: env.image, HostAgent: env.hostAgent})
	os.Setenv(envBuilt, string(shared))
	code := m.Run()
	if registryDir != "" {
		_ = os.RemoveAll(registryDir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	_, _ = eng.ImageRemove(ctx, env.image, image.RemoveOptions{Force: true, PruneChildren: true})
	cancel()
	// Closing the client closes its idle connections; after that no
	// goroutine of the tests or of the backend may be left.
	eng.Close()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goroutines left behind: %v\n", err)
			return 1
		}
	}
	return code
}

// setup builds the static binaries and the FROM-scratch test image.
func setup(dir string) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	env.runnerd = filepath.Join(dir, "runnerd")
	env.hostAgent = filepath.Join(dir, "demoagent")
	bins := map[string]string{
		env.runnerd:                     "./cmd/runnerd",
		env.hostAgent:                   "./cmd/demoagent",
		filepath.Join(dir, "testagent"): "./sandbox/docker/testdata/testagent",
	}
	for out, pkg := range bins {
		if err := goBuild(root, out, pkg); err != nil {
			return err
		}
	}
	env.agent = []string{imgDemoAgent}

	tag := "runnerd-test/agent:" + randHex(6)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A named non-root user the engine resolves from the image's own
	// files, and no /workspace in the image: the backend must hand the
	// fresh volume to that user itself.
	err = docker.BuildScratchImage(ctx, env.engine, docker.ScratchImage{
		Tag: tag,
		Files: []docker.ImageFile{
			{Path: imgDemoAgent, Source: filepath.Join(dir, "demoagent"), Exec: true},
			{Path: imgTestAgent, Source: filepath.Join(dir, "testagent"), Exec: true},
			{Path: "/etc/passwd", Data: []byte("root:x:0:0:root:/:/bin/false\nagent:x:" + imgUID + ":" + imgUID + ":agent:/workspace:/bin/false\n")},
			{Path: "/etc/group", Data: []byte("root:x:0:\nagent:x:" + imgUID + ":\n")},
		},
		User:   "agent",
		Labels: map[string]string{"runnerd.test": "true"},
	})
	if err != nil {
		return err
	}
	env.image = tag
	return nil
}

func goBuild(root, out, pkg string) error {
	cmd := exec.Command(goBinary(), "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	return nil
}

func goBinary() string {
	if gobin, err := exec.LookPath("go"); err == nil {
		return gobin
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the test directory")
		}
		dir = parent
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newBackend makes a backend for a host of its own, so that tests running
// beside each other (and other helpers' containers) never meet, and makes
// the test's end assert that nothing labelled with that host is left.
func newBackend(tb testing.TB, modify func(*docker.Config)) (*docker.Backend, docker.Config) {
	tb.Helper()
	if env.skip != "" {
		tb.Skip(env.skip)
	}
	host := "test-" + randHex(6)
	cfg := docker.Config{
		Engine:       env.engine,
		Host:         host,
		StateDir:     tb.TempDir(),
		RunnerdPath:  env.runnerd,
		StartTimeout: 30 * time.Second,
		StopTimeout:  time.Second,
	}
	if modify != nil {
		modify(&cfg)
	}
	b, err := docker.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { assertNothingLeft(tb, host) })
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// Sweep with the real engine even when the test's own backend
		// was given an unreachable one.
		c := cfg
		c.Engine = env.engine
		sweeper, err := docker.New(c)
		if err != nil {
			tb.Fatal(err)
		}
		if _, err := sweeper.Sweep(ctx, func(string) bool { return true }); err != nil {
			tb.Errorf("teardown sweep: %v", err)
		}
	})
	return b, cfg
}

// hostFilter selects everything labelled with host.
func hostFilter(host string) filters.Args {
	return filters.NewArgs(filters.Arg("label", docker.LabelHost+"="+host))
}

// assertNothingLeft fails the test if any container, volume or network
// labelled with host is still there, and then removes them so that one
// failure does not leak into the next run.
func assertNothingLeft(tb testing.TB, host string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := env.engine.ContainerList(ctx, container.ListOptions{All: true, Filters: hostFilter(host)})
	if err != nil {
		tb.Fatalf("teardown: list containers: %v", err)
	}
	for _, c := range cs {
		tb.Errorf("teardown: container %.12s (%v) left behind", c.ID, c.Labels)
		_ = env.engine.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true})
	}
	vs, err := env.engine.VolumeList(ctx, volume.ListOptions{Filters: hostFilter(host)})
	if err != nil {
		tb.Fatalf("teardown: list volumes: %v", err)
	}
	for _, v := range vs.Volumes {
		tb.Errorf("teardown: volume %s left behind", v.Name)
		_ = env.engine.VolumeRemove(ctx, v.Name, true)
	}
	ns, err := env.engine.NetworkList(ctx, network.ListOptions{Filters: hostFilter(host)})
	if err != nil {
		tb.Fatalf("teardown: list networks: %v", err)
	}
	for _, n := range ns {
		tb.Errorf("teardown: network %s left behind", n.Name)
		_ = env.engine.NetworkRemove(ctx, n.ID)
	}
}

// containersOf lists the containers labelled with host and conversation.
func containersOf(tb testing.TB, host, conv string) []container.Summary {
	tb.Helper()
	f := hostFilter(host)
	if conv != "" {
		f.Add("label", docker.LabelConversation+"="+conv)
	}
	cs, err := env.engine.ContainerList(context.Background(), container.ListOptions{All: true, Filters: f})
	if err != nil {
		tb.Fatal(err)
	}
	return cs
}

func volumesOf(tb testing.TB, host, conv string) []*volume.Volume {
	tb.Helper()
	f := hostFilter(host)
	if conv != "" {
		f.Add("label", docker.LabelConversation+"="+conv)
	}
	vs, err := env.engine.VolumeList(context.Background(), volume.ListOptions{Filters: f})
	if err != nil {
		tb.Fatal(err)
	}
	return vs.Volumes
}

func isNotFound(err error) bool { return cerrdefs.IsNotFound(err) }
