package integration

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/docker/docker/api/types/image"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// TestDockerImagePulledOnTimeline: under the default --pull missing, the
// first turn of a conversation whose image is only in a registry (one on
// loopback, sandbox/docker/testdata/registry) pulls it, succeeds, and has
// image_pulled with its duration on its job's timeline; the
// conversation's next turn reuses its container and pulls nothing.
func TestDockerImagePulledOnTimeline(t *testing.T) {
	t.Parallel()
	e := newDockerEnv(t, envOpts{}, "")
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "registry")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, ".")
	build.Dir = filepath.Join(root, "sandbox", "docker", "testdata", "registry")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the registry: %v\n%s", err, out)
	}
	reg := exec.Command(bin, "-addr", "127.0.0.1:0")
	out, err := reg.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Process.Kill(); _ = reg.Wait() })
	lines := bufio.NewScanner(out)
	if !lines.Scan() {
		t.Fatalf("registry printed no address: %v", lines.Err())
	}
	ref := strings.TrimSpace(lines.Text()) + "/runnerd-test/pulled:v1"
	go func() { _, _ = io.Copy(io.Discard, out) }()

	if err := e.eng.ImageTag(e.ctx, e.tag, ref); err != nil {
		t.Fatal(err)
	}
	rc, err := e.eng.ImagePush(e.ctx, ref, image.PushOptions{RegistryAuth: "e30="}) // {}: no credentials
	if err != nil {
		t.Fatal(err)
	}
	err = pushError(rc)
	rc.Close()
	if err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	if _, err := e.eng.ImageRemove(e.ctx, ref, image.RemoveOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = e.eng.ImageRemove(e.ctx, ref, image.RemoveOptions{}) })

	e.startDaemon(func(c *fleet.DaemonConfig) {
		c.Sandbox = "docker"
		c.Args = append(c.Args, "--sandbox-sweep", "0")
	})
	conv, err := e.user.Create(e.ctx, wire.CreateConversationRequest{Title: "registry image", Image: ref, AgentCommand: []string{"/demoagent"}})
	if err != nil {
		t.Fatal(err)
	}
	for i, wantPulls := range []int{1, 0} {
		j := e.waitEnded(e.send(conv.ID, "hello").ID)
		if j.State != wire.JobSucceeded {
			t.Fatalf("turn %d of a registry image: %s", i+1, describeJob(j))
		}
		pulls := 0
		for _, ev := range j.Events {
			if ev.Type != wire.EventImagePulled {
				continue
			}
			pulls++
			var d struct {
				Image      string `json:"image"`
				DurationMS *int64 `json:"duration_ms"`
			}
			if err := json.Unmarshal(ev.Data, &d); err != nil || d.Image != ref || d.DurationMS == nil || *d.DurationMS < 0 {
				t.Errorf("image_pulled event %s: %v; want the image and its duration", ev.Data, err)
			}
		}
		if pulls != wantPulls {
			t.Errorf("turn %d: %d image_pulled events, want %d: %s", i+1, pulls, wantPulls, describeJob(j))
		}
	}
}

func pushError(r io.Reader) error {
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
