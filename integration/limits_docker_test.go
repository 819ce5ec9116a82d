package integration

import (
	"testing"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// TestConversationLimitsDocker is issue 21 §6 (limits) end to end on the Docker backend
// against the real engine: a conversation created with limits has them
// applied to its container, as `docker inspect` shows, on a daemon whose
// own --docker-memory (1 GiB) and --docker-pids (256) are far higher; a
// memory hog under the conversation's memory limit ends oom_killed and a
// fork bomb under its pids limit pids_exhausted, both with evidence; a
// conversation asking more than the host allows gets the host's limits.
func TestConversationLimitsDocker(t *testing.T) {
	t.Parallel()
	e := newDockerEnv(t, envOpts{}, "")
	e.startDaemon(func(c *fleet.DaemonConfig) {
		c.Sandbox = "docker"
		c.Capacity = 3
		c.Args = append(c.Args, "--sandbox-sweep", "0", "--docker-memory", "1073741824", "--docker-pids", "256", "--docker-cpus", "1")
	})
	// The /tmp tmpfs (64 MiB) is charged to the container's memory: the
	// limit leaves room for it beside the supervisor.
	small := wire.Limits{MemoryBytes: 192 << 20, Pids: 64, CPUs: 0.5}
	create := func(title string, l wire.Limits) wire.Conversation {
		c, err := e.user.Create(e.ctx, wire.CreateConversationRequest{Title: title, Image: e.tag, AgentCommand: []string{"/demoagent"}, Limits: l})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	hog, bomb, big := create("hog", small), create("fork bomb", small), create("big", wire.Limits{MemoryBytes: 4 << 30, Pids: 1000, CPUs: 8})
	jHog, jBomb, jBig := e.send(hog.ID, "!hog"), e.send(bomb.ID, "!forkbomb"), e.send(big.ID, "hello")

	checkCause(t, "memory hog", e.waitEnded(jHog.ID), wire.JobFailed, wire.CauseOOMKilled, "oom_kill")
	checkCause(t, "fork bomb", e.waitEnded(jBomb.ID), wire.JobFailed, wire.CausePidsExhausted, "pids")
	if j := e.waitEnded(jBig.ID); j.State != wire.JobSucceeded {
		t.Errorf("the turn of the conversation asking more than the host allows: %s", describeJob(j))
	}
	for _, tc := range []struct {
		name             string
		conv             wire.Conversation
		mem, pids, nanos int64
	}{
		{"hog", hog, 192 << 20, 64, 500_000_000},
		{"fork bomb", bomb, 192 << 20, 64, 500_000_000},
		{"big", big, 1 << 30, 256, 1_000_000_000},
	} {
		ids := e.containers(tc.conv.ID)
		if len(ids) != 1 {
			t.Fatalf("%s: containers %v, want one", tc.name, ids)
		}
		info, err := e.eng.ContainerInspect(e.ctx, ids[0])
		if err != nil {
			t.Fatal(err)
		}
		hc := info.HostConfig
		if hc.Memory != tc.mem || hc.PidsLimit == nil || *hc.PidsLimit != tc.pids || hc.NanoCPUs != tc.nanos {
			t.Errorf("%s: docker inspect shows memory %d pids %v nano cpus %d; want %d, %d, %d", tc.name, hc.Memory, hc.PidsLimit, hc.NanoCPUs, tc.mem, tc.pids, tc.nanos)
		}
	}
	if c, err := e.user.Conversation(e.ctx, hog.ID); err != nil || c.State != wire.ConversationUsable || c.Limits != small {
		t.Errorf("the hog's conversation after its OOM kill: %+v, %v; want usable with limits %+v", c, err, small)
	}
}
