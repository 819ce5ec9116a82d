package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// TestS5CausesDocker is S5's chaos campaign on the Docker backend against
// the real engine: each abnormal end that can be injected here is
// injected into a turn of its own conversation, and the job names its
// exact cause from the closed list, with evidence — never unknown.
//
//   - a memory hog under --docker-memory: oom_killed, from the container's
//     memory cgroup oom_kill count (cgroup v1 memory.oom_control here);
//   - a fork bomb under --docker-pids: pids_exhausted, from its pids
//     cgroup's "max" count;
//   - the container's /tmp tmpfs written full: disk_full, ENOSPC seen by
//     the supervisor's probe with the free space measured;
//   - an agent exiting 3: agent_exit; an agent killing itself with
//     SIGKILL: agent_signal (no OOM kill counted: not oom_killed);
//   - an agent that never ends, on a daemon with a short --exec-timeout:
//     execution_timeout.
func TestS5CausesDocker(t *testing.T) {
	t.Parallel()
	type injection struct {
		name, prompt string
		cause        wire.Cause
		evidence     string // a part of the evidence
	}
	limited := []injection{
		{"memory hog", "!hog", wire.CauseOOMKilled, "oom_kill"},
		{"fork bomb", "!forkbomb", wire.CausePidsExhausted, "pids"},
		{"tmpfs filled", "!fill /tmp/fill", wire.CauseDiskFull, "ENOSPC"},
		{"exit 3", "!exit 3", wire.CauseAgentExit, "exited 3"},
		{"signal", "!crash", wire.CauseAgentSignal, "SIGKILL"},
	}
	t.Run("limits", func(t *testing.T) {
		t.Parallel()
		e := newDockerEnv(t, envOpts{}, "")
		e.startDaemon(func(c *fleet.DaemonConfig) {
			c.Sandbox = "docker"
			c.Capacity = 2
			// The /tmp tmpfs (64 MiB) is charged to the container's
			// memory: the limit leaves room for it beside the supervisor.
			c.Args = append(c.Args, "--sandbox-sweep", "0", "--docker-memory", "201326592", "--docker-pids", "64")
		})
		jobs := map[string]wire.Job{}
		for _, in := range limited {
			jobs[in.name] = e.send(e.conversation(in.name).ID, in.prompt)
		}
		for _, in := range limited {
			j := e.waitEnded(jobs[in.name].ID)
			checkCause(t, in.name, j, wire.JobFailed, in.cause, in.evidence)
		}
	})
	t.Run("execution timeout", func(t *testing.T) {
		t.Parallel()
		e := newDockerEnv(t, envOpts{}, "")
		e.startDaemon(func(c *fleet.DaemonConfig) {
			c.Sandbox = "docker"
			c.ExecTimeout = 5 * time.Second
			c.Args = append(c.Args, "--sandbox-sweep", "0")
		})
		j := e.waitEnded(e.send(e.conversation("never ends").ID, "!hang").ID)
		checkCause(t, "execution timeout", j, wire.JobFailed, wire.CauseExecTimeout, "execution deadline")
	})
}

func checkCause(t *testing.T, name string, j wire.Job, state string, cause wire.Cause, evidence string) {
	t.Helper()
	switch {
	case j.Cause == wire.CauseUnknown:
		t.Errorf("%s: cause unknown (%q): %s", name, j.CauseEvidence, describeJob(j))
	case j.State != state || j.Cause != cause || !strings.Contains(j.CauseEvidence, evidence):
		t.Errorf("%s: job %s with cause %q (%q); want %s with cause %q, evidence naming %q: %s",
			name, j.State, j.Cause, j.CauseEvidence, state, cause, evidence, describeJob(j))
	default:
		t.Logf("%s: %s: %s", name, j.Cause, j.CauseEvidence)
	}
}
