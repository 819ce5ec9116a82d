package docker_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/registry"

	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/docker"
)

// testRegistry is a local image registry (testdata/registry, its own
// module) run as a process on loopback, which the engine may use without
// TLS (127.0.0.0/8 is insecure-allowed by default).
type testRegistry struct{ addr string }

// registryDir holds the registry binary once built; TestMain removes it.
var registryDir string

var registryBin = sync.OnceValues(func() (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "runnerd-registry-")
	if err != nil {
		return "", err
	}
	registryDir = dir
	out := filepath.Join(dir, "registry")
	cmd := exec.Command(goBinary(), "build", "-trimpath", "-o", out, ".")
	cmd.Dir = filepath.Join(root, "sandbox", "docker", "testdata", "registry")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build testdata/registry: %v\n%s", err, b)
	}
	return out, nil
})

// startRegistry runs a registry for the test, behind basic auth when user
// is not empty, and stops it at the test's end.
func startRegistry(t *testing.T, user, pass string) *testRegistry {
	t.Helper()
	bin, err := registryBin()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"-addr", "127.0.0.1:0"}
	if user != "" {
		args = append(args, "-user", user, "-pass", pass)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(out)
	if !lines.Scan() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("registry printed no address: %v", lines.Err())
	}
	r := &testRegistry{addr: strings.TrimSpace(lines.Text())}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return r
}

// pulls counts the pulls of repo:v1 the registry served: the
// engine resolves the tag once per pull (HEAD, or GET), then fetches by
// digest only what it does not have; a push only PUTs the tag.
func (r *testRegistry) pulls(t *testing.T, repo string) int {
	t.Helper()
	resp, err := http.Get("http://" + r.addr + "/_requests")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(string(body), "\n") {
		if l == "HEAD /v2/"+repo+"/manifests/v1 200" || l == "GET /v2/"+repo+"/manifests/v1 200" {
			n++
		}
	}
	return n
}

// push puts the test image into the registry as a new repository and
// removes that name from the engine again (the layers stay, under the
// test image's own tag), so the name is "not on this host". It returns
// the reference and the repository.
func (r *testRegistry) push(t *testing.T, user, pass string) (ref, repo string) {
	t.Helper()
	ctx := testCtx(t)
	repo = "runnerd-test/pull-" + randHex(4)
	ref = r.addr + "/" + repo + ":v1"
	if err := env.engine.ImageTag(ctx, env.image, ref); err != nil {
		t.Fatal(err)
	}
	auth := ""
	if user != "" {
		var err error
		if auth, err = registry.EncodeAuthConfig(registry.AuthConfig{Username: user, Password: pass, ServerAddress: r.addr}); err != nil {
			t.Fatal(err)
		}
	}
	rc, err := env.engine.ImagePush(ctx, ref, image.PushOptions{RegistryAuth: auth})
	if err != nil {
		t.Fatal(err)
	}
	err = streamError(rc)
	rc.Close()
	if err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	removeImage(t, ref)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = env.engine.ImageRemove(ctx, ref, image.RemoveOptions{})
	})
	return ref, repo
}

// removeImage removes the name ref from the engine (not the layers the
// test image shares).
func removeImage(t *testing.T, ref string) {
	t.Helper()
	if _, err := env.engine.ImageRemove(testCtx(t), ref, image.RemoveOptions{}); err != nil {
		t.Fatalf("remove %s: %v", ref, err)
	}
}

func streamError(r io.Reader) error {
	dec := json.NewDecoder(r)
	for {
		var msg struct {
			Error string `json:"error"`
		}
		if err := dec.Decode(&msg); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
		if msg.Error != "" {
			return errors.New(msg.Error)
		}
	}
}

func pullSpec(ref string) sandbox.Spec {
	s := newSpec()
	s.Image = ref
	return s
}

// ensureRemoving ensures spec's sandbox and removes it at the test's end.
func ensureRemoving(t *testing.T, b *docker.Backend, spec sandbox.Spec) (sandbox.Sandbox, error) {
	t.Helper()
	ctx := testCtx(t)
	if err := b.Preflight(ctx, spec); err != nil {
		t.Fatalf("preflight of %s: %v", spec.Image, err)
	}
	sb, err := b.Ensure(ctx, spec)
	if err == nil {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := b.Remove(ctx, spec.ConversationID); err != nil {
				t.Errorf("remove: %v", err)
			}
		})
	}
	return sb, err
}

// --pull missing (the default): the first container made from an image
// not on this host pulls it, once; the next conversation's container and
// the retained one's next turn use it without asking the registry.
func TestDockerPullMissingPullsOnceThenReuses(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t, "", "")
	ref, repo := reg.push(t, "", "")
	b, _ := newBackend(t, nil)

	first := pullSpec(ref)
	sb, err := ensureRemoving(t, b, first)
	if err != nil {
		t.Fatalf("ensure from a registry image: %v", err)
	}
	if sb.Pulled == nil || sb.Pulled.Image != ref || sb.Pulled.Duration <= 0 {
		t.Fatalf("first container: Pulled = %+v, want the pull of %s", sb.Pulled, ref)
	}
	if got := reg.pulls(t, repo); got != 1 {
		t.Fatalf("registry served %d pulls after the first container, want 1", got)
	}
	t.Logf("pull of %s: %v (its layers already on the engine)", ref, sb.Pulled.Duration)
	if out := runTurn(t, testCtx(t), sb, env.agent, "from a pulled image"); out.result.ExitCode != 0 {
		t.Fatalf("turn in the pulled image: %+v", out.result)
	}
	again, err := b.Ensure(testCtx(t), first)
	if err != nil || again.ID != sb.ID || again.Pulled != nil {
		t.Fatalf("retained container's next Ensure: %+v, %v; want the same container, no pull", again, err)
	}
	second, err := ensureRemoving(t, b, pullSpec(ref))
	if err != nil || second.Pulled != nil {
		t.Fatalf("second conversation: %+v, %v; want its container from the image already here", second, err)
	}
	if got := reg.pulls(t, repo); got != 1 {
		t.Fatalf("registry served %d pulls in all, want the one pull", got)
	}
}

// --pull always: every container made pulls again; a retained container
// keeps its own image and pulls nothing.
func TestDockerPullAlwaysPullsForEveryContainer(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t, "", "")
	ref, repo := reg.push(t, "", "")
	b, _ := newBackend(t, func(c *docker.Config) { c.Pull = docker.PullAlways })
	first := pullSpec(ref)
	for i, spec := range []sandbox.Spec{first, pullSpec(ref)} {
		sb, err := ensureRemoving(t, b, spec)
		if err != nil || sb.Pulled == nil {
			t.Fatalf("container %d: %+v, %v; want it made after a pull", i+1, sb, err)
		}
		if got := reg.pulls(t, repo); got != i+1 {
			t.Fatalf("registry served %d pulls after container %d, want %d", got, i+1, i+1)
		}
	}
	if sb, err := b.Ensure(testCtx(t), first); err != nil || sb.Pulled != nil {
		t.Fatalf("retained container: %+v, %v; want it reused without a pull", sb, err)
	}
	if got := reg.pulls(t, repo); got != 2 {
		t.Fatalf("registry served %d pulls, want 2 (one per container made)", got)
	}
}

// --pull never: an image not on this host declines in the preflight
// (image_unavailable, the conversation's fault, S4) and fails Ensure; the
// registry is never asked and nothing is made.
func TestDockerPullNeverRefusesAnAbsentImage(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t, "", "")
	ref, repo := reg.push(t, "", "")
	b, cfg := newBackend(t, func(c *docker.Config) { c.Pull = docker.PullNever })
	ctx := testCtx(t)
	spec := pullSpec(ref)
	var pe *sandbox.PreflightError
	if err := b.Preflight(ctx, spec); !errors.As(err, &pe) || pe.Class != sandbox.ClassImageUnavailable || !sandbox.ConversationFault(pe.Class) {
		t.Fatalf("preflight = %v, want class %s, the conversation's fault", err, sandbox.ClassImageUnavailable)
	}
	if _, err := b.Ensure(ctx, spec); !errors.Is(err, sandbox.ErrImageUnavailable) {
		t.Fatalf("ensure = %v, want ErrImageUnavailable", err)
	}
	if got := reg.pulls(t, repo); got != 0 {
		t.Fatalf("registry served %d pulls under --pull never", got)
	}
	if cs, vs := containersOf(t, cfg.Host, ""), volumesOf(t, cfg.Host, ""); len(cs)+len(vs) != 0 {
		t.Fatalf("%d containers and %d volumes made for an unavailable image", len(cs), len(vs))
	}
}

// An image that cannot be pulled — not in the registry, or no registry
// answering — passes the preflight (nothing there pulls) and fails Ensure
// with ErrImageUnavailable before anything is made, so the turn fails
// before admission as the conversation's fault (S4).
func TestDockerUnpullableImageFailsEnsure(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t, "", "")
	b, cfg := newBackend(t, nil)
	for _, ref := range []string{
		reg.addr + "/runnerd-test/not-pushed-" + randHex(4) + ":v1",
		"127.0.0.1:9/runnerd-test/no-registry:v1", // the discard port: nothing listens
	} {
		sb, err := ensureRemoving(t, b, pullSpec(ref))
		if !errors.Is(err, sandbox.ErrImageUnavailable) {
			t.Fatalf("ensure of %s = %+v, %v; want ErrImageUnavailable", ref, sb, err)
		}
	}
	if cs, vs := containersOf(t, cfg.Host, ""), volumesOf(t, cfg.Host, ""); len(cs)+len(vs) != 0 {
		t.Fatalf("%d containers and %d volumes made for unpullable images", len(cs), len(vs))
	}
}

// A registry behind basic auth is pulled from with the credentials of
// config.json in DOCKER_CONFIG, as the engine's own client would; without
// them the pull is refused and the image unavailable.
func TestDockerPullUsesDockerConfigCredentials(t *testing.T) {
	// t.Setenv: not parallel.
	const user, pass = "runnerd", "s3cret-" + "pull"
	reg := startRegistry(t, user, pass)
	ref, repo := reg.push(t, user, pass)
	b, _ := newBackend(t, func(c *docker.Config) { c.Pull = docker.PullAlways })

	t.Setenv("DOCKER_CONFIG", t.TempDir()) // no config.json: anonymous
	if _, err := ensureRemoving(t, b, pullSpec(ref)); !errors.Is(err, sandbox.ErrImageUnavailable) {
		t.Fatalf("ensure without credentials = %v, want ErrImageUnavailable", err)
	}
	if got := reg.pulls(t, repo); got != 0 {
		t.Fatalf("registry served %d pulls to an anonymous pull", got)
	}

	dir := t.TempDir()
	cfg := fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, reg.addr, base64.StdEncoding.EncodeToString([]byte(user+":"+pass)))
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DOCKER_CONFIG", dir)
	sb, err := ensureRemoving(t, b, pullSpec(ref))
	if err != nil || sb.Pulled == nil {
		t.Fatalf("ensure with DOCKER_CONFIG's credentials: %+v, %v; want a pull", sb, err)
	}
	if got := reg.pulls(t, repo); got != 1 {
		t.Fatalf("registry served %d pulls, want the one authenticated pull", got)
	}
}
