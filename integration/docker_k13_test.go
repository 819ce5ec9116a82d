package integration

import (
	"context"
	"net/http"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/sandbox/docker"
	"github.com/runnerd/runnerd/wire"
)

// dockerEnv is a test env whose daemon runs the docker backend against
// the real engine, with an image built FROM scratch over the demo agent;
// the test's containers and volumes are removed at its end. The sandbox
// sweep is off, so that a LOST conversation's container stays to be read.
type dockerEnv struct {
	*env
	eng *client.Client
	tag string
}

func newDockerEnv(t *testing.T, o envOpts, runnerd string) *dockerEnv {
	t.Helper()
	eng := dockerEngine(t)
	e := newEnv(t, o)
	if runnerd != "" {
		installBinary(t, runnerd, e.runnerd)
	}
	const tag = "runnerd-test/k13-agent:dev"
	if err := docker.BuildScratchImage(e.ctx, eng, docker.ScratchImage{
		Tag:   tag,
		Files: []docker.ImageFile{{Path: "/demoagent", Source: bins.DemoAgent, Exec: true}},
		User:  "65534:65534",
	}); err != nil {
		t.Fatal(err)
	}
	be, err := docker.New(docker.Config{Engine: eng, Host: e.host, StateDir: e.stateDir, RunnerdPath: e.runnerd})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := be.Sweep(ctx, func(string) bool { return true }); err != nil {
			t.Errorf("remove the test's containers: %v", err)
		}
	})
	return &dockerEnv{env: e, eng: eng, tag: tag}
}

// startDockerDaemon starts the daemon on the docker backend, each of mods
// applied to its configuration after that.
func (e *dockerEnv) startDockerDaemon(mods ...func(*fleet.DaemonConfig)) *fleet.Daemon {
	return e.startDaemon(func(c *fleet.DaemonConfig) {
		c.Sandbox = "docker"
		c.Args = append(c.Args, "--sandbox-sweep", "0")
		for _, mod := range mods {
			mod(c)
		}
	})
}

func (e *dockerEnv) conversation(title string) wire.Conversation {
	e.t.Helper()
	c, err := e.user.Create(e.ctx, wire.CreateConversationRequest{Title: title, Image: e.tag, AgentCommand: []string{"/demoagent"}})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// containers are the ids of the conversation's containers on the engine.
func (e *dockerEnv) containers(convID string) []string {
	e.t.Helper()
	list, err := e.eng.ContainerList(e.ctx, container.ListOptions{All: true, Filters: filters.NewArgs(
		filters.Arg("label", docker.LabelHost+"="+e.host),
		filters.Arg("label", docker.LabelConversation+"="+convID),
	)})
	if err != nil {
		e.t.Fatal(err)
	}
	var ids []string
	for _, c := range list {
		ids = append(ids, c.ID)
	}
	return ids
}

// TestK13Docker is K13 on the Docker backend against the real engine. An
// admitted turn's settlement tries are all refused (R24), after the agent
// completed in its retained container: the conversation is quarantined.
//
//   - same container: the next message verifies the exact retained
//     container and its supervisor's retained record of the interrupted
//     activation (R26), records the boundary (conversation_resumed) and runs
//     on the same native session, in the same container, at native turn 2.
//   - container replaced: the container is removed (its workspace volume
//     kept) between the quarantine and the next message, whose turn makes a
//     new container over the same volume — not the exact retained one — and
//     reports the conversation unrecoverable: LOST in plain words, the
//     message's prompt never reaching the agent.
func TestK13Docker(t *testing.T) {
	t.Parallel()
	for _, replaced := range []bool{false, true} {
		name := "same container"
		if replaced {
			name = "container replaced"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// Nothing here waits for a lease to run out (the quarantine
			// comes from the finish report): a calm lease keeps a loaded
			// machine's slow renewals from ending the first turn early.
			e := newDockerEnv(t, envOpts{faults: true, leaseTTL: calmLease}, "")
			e.startDockerDaemon(calm)
			c := e.conversation("k13 in docker: " + name)
			const first, next = "a turn whose settlement never gets through\n!events 1", "the message after it"
			e.faults.refuse(wire.OpSettlement, http.StatusServiceUnavailable)
			j := e.send(c.ID, first)
			e.quarantined(c.ID, j.ID)
			e.faults.refuse("", 0)
			retained := e.conv(c.ID).ContainerID
			if ids := e.containers(c.ID); retained == "" || !slices.Equal(ids, []string{retained}) {
				t.Fatalf("containers %v, want the recorded %q only", ids, retained)
			}
			if !replaced {
				e.resumes(c.ID, next, 0, 2)
				if got := e.conv(c.ID).ContainerID; got != retained {
					t.Errorf("the resumed turn ran in container %s, want the retained %s", got, retained)
				}
				if got := containerTranscript(t, e.eng, retained); !slices.Equal(got, []string{first, next}) {
					t.Errorf("the agent in the container received %q, want each prompt once", got)
				}
				return
			}
			if err := e.eng.ContainerRemove(e.ctx, retained, container.RemoveOptions{Force: true}); err != nil {
				t.Fatal(err)
			}
			e.unrecoverable(c.ID, next)
			ids := e.containers(c.ID)
			if len(ids) != 1 || ids[0] == retained {
				t.Fatalf("containers %v, want one made anew over the workspace", ids)
			}
			// The new container sees the same workspace volume: the
			// transcript holds the first prompt, never the second. The
			// daemon removes a LOST conversation's sandbox once its report
			// is answered, so the container may be gone by now; then the
			// unadmitted job (unrecoverable above: no admission, so no
			// prompt, R25) is the evidence that stands.
			if got, gone := containerTranscriptUnlessGone(t, e.eng, ids[0]); gone {
				t.Logf("container %s already removed as LOST; its transcript cannot be read", ids[0])
			} else if !slices.Equal(got, []string{first}) {
				t.Errorf("the agent's transcript %q, want only the interrupted turn's prompt", got)
			}
		})
	}
}

// TestUpgradeFromPreviousReleaseDocker on the Docker backend
// against the real engine: the previous release's daemon runs a turn in a
// retained container whose supervisor is the previous release's runnerd,
// bind-mounted from the daemon's path. The binary is replaced and the new
// daemon started; the next turn finds that supervisor idle and speaking the
// unversioned protocol, restarts the container (sandbox_container_restarted,
// outdated_protocol), which runs this build's supervisor over the same
// container, workspace and state, and the turn runs in the same container
// at native turn 2, each prompt once.
func TestUpgradeFromPreviousReleaseDocker(t *testing.T) {
	t.Parallel()
	old := previousRunnerd(t)
	e := newDockerEnv(t, envOpts{}, old)
	d := e.startDockerDaemon()
	c := e.conversation("upgraded in docker")
	const first, next = "before the upgrade", "after the upgrade"
	if j := e.waitEnded(e.send(c.ID, first).ID); j.State != wire.JobSucceeded {
		t.Fatalf("the previous release's turn: %s", describeJob(j))
	}
	ctr := e.conv(c.ID).ContainerID
	e.kill9(d)
	installBinary(t, bins.Runnerd, e.runnerd)
	d = e.restart(d)
	j := e.waitEnded(e.send(c.ID, next).ID)
	if j.State != wire.JobSucceeded || len(j.Attempts) != 1 || j.Attempts[0].ContainerID != ctr {
		t.Fatalf("the first turn after the upgrade, want it to succeed in container %s: %s", ctr, describeJob(j))
	}
	if cv := e.conv(c.ID); cv.State != wire.ConversationUsable || cv.NativeTurn != 2 {
		t.Errorf("conversation %s at native turn %d, want usable at 2", cv.State, cv.NativeTurn)
	}
	if !regexp.MustCompile(`"msg":"sandbox_container_restarted".*"class":"outdated_protocol"`).MatchString(d.Output()) {
		t.Errorf("the previous release's supervisor was not replaced for its protocol version")
	}
	if got := containerTranscript(t, e.eng, ctr); !slices.Equal(got, []string{first, next}) {
		t.Errorf("the agent in the container received %q, want each prompt once", got)
	}
}

// TestK13QuarantinedUnderThePreviousReleaseDocker is
// TestK13QuarantinedUnderThePreviousRelease on the Docker backend against
// the real engine: under the previous release every settlement try of an
// admitted turn is refused (R24), after the agent completed in its retained
// container, and the conversation is quarantined with a supervisor state
// that holds no retained record. After the upgrade the next message's turn
// restarts the container (outdated_protocol); this build's supervisor
// takes the bind-mounted state over, and the turn resumes the session in
// the same container at native turn 2, each prompt once: not LOST.
func TestK13QuarantinedUnderThePreviousReleaseDocker(t *testing.T) {
	t.Parallel()
	old := previousRunnerd(t)
	e := newDockerEnv(t, envOpts{faults: true}, old)
	d := e.startDockerDaemon()
	c := e.conversation("quarantined in docker under the previous release")
	const first, next = "a turn whose settlement never gets through\n!events 1", "the first message after the upgrade"
	e.faults.refuse(wire.OpSettlement, http.StatusServiceUnavailable)
	j := e.send(c.ID, first)
	e.quarantined(c.ID, j.ID)
	e.faults.refuse("", 0)
	retained := e.conv(c.ID).ContainerID
	e.kill9(d)
	installBinary(t, bins.Runnerd, e.runnerd)
	d = e.restart(d)
	e.resumes(c.ID, next, 0, 2)
	if got := e.conv(c.ID).ContainerID; got != retained {
		t.Errorf("the resumed turn ran in container %s, want the retained %s", got, retained)
	}
	if !regexp.MustCompile(`"msg":"sandbox_container_restarted".*"class":"outdated_protocol"`).MatchString(d.Output()) {
		t.Errorf("the previous release's supervisor was not replaced for its protocol version")
	}
	if got := containerTranscript(t, e.eng, retained); !slices.Equal(got, []string{first, next}) {
		t.Errorf("the agent in the container received %q, want each prompt once", got)
	}
}
