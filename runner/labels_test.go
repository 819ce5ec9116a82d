package runner

import (
	"context"
	"reflect"
	"runtime"
	"testing"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// Routing: the daemon's host heartbeat carries its labels
// with the automatic sandbox, os and arch, and so a process-sandbox host
// is never given a Docker conversation's turn (before, it claimed it and
// declined it), while it runs the process conversation's turn queued after.
func TestHostLabelsKeepDockerTurnsOffProcessHost(t *testing.T) {
	c := newCP(t)
	ctx := context.Background()
	queue := func(sandbox string) wire.Job {
		conv, err := c.st.CreateConversation(ctx, wire.CreateConversationRequest{Image: "scratch", AgentCommand: []string{"demoagent"}, Sandbox: sandbox}, c.now())
		if err != nil {
			t.Fatal(err)
		}
		j, err := c.st.EnqueueTurn(ctx, conv.ID, "result", c.now())
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	docker, process := queue(wire.SandboxDocker), queue(wire.SandboxProcess)
	startDaemon(t, c, func(cfg *Config) { cfg.Labels = wire.Labels{"zone": "eu-1"} })

	want := wire.Labels{"sandbox": "process", "os": runtime.GOOS, "arch": runtime.GOARCH, "zone": "eu-1"}
	waitFor(t, "the host's labels in Admin → Servers", 10*time.Second, func() bool {
		return reflect.DeepEqual(c.server(t, "host-a").Labels, want)
	})
	waitFor(t, "the process turn to end", 15*time.Second, ended(c, process.ID))
	if j := c.job(docker.ID); j.State != wire.JobQueued || len(j.Attempts) != 0 {
		t.Fatalf("the Docker turn on a process host: %s with %d attempt(s); want queued, never claimed", j.State, len(j.Attempts))
	}
}

// The automatic labels are the daemon's: an operator's --label may not set them.
func TestAutomaticLabelsNotSetByHand(t *testing.T) {
	if _, err := hostLabels(wire.Labels{"sandbox": "docker"}, "process"); err == nil {
		t.Fatal("a process host was let say sandbox=docker")
	}
	if _, err := hostLabels(wire.Labels{"zone": "eu 1"}, "process"); err == nil {
		t.Fatal("a label value with a space was accepted")
	}
}
