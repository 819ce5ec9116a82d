package integration

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/sandbox/docker"
	"github.com/runnerd/runnerd/wire"
)

// freshControlPlane starts a second control plane like the test's own, on
// a new, empty SQLite database (so a new cluster identity), and registers
// the test's host name with it; it returns the server and the host's token
// file for it. Its lease is lease, as the test's own control plane's.
func (e *env) freshControlPlane(name string, lease time.Duration) (*fleet.ControlPlane, string) {
	e.t.Helper()
	cp, err := fleet.StartControlPlane(e.ctx, fleet.ControlPlaneConfig{
		Bin:            bins.ControlPlane,
		DataDir:        filepath.Join(e.dir, name),
		LeaseTTL:       lease,
		MinLeaseTTL:    renewEvery + renewTimeout,
		ReaperInterval: reaperInterval,
		ReaperGrace:    reaperGrace,
		ClaimWaitMax:   time.Second,
		ReleaseBackoff: 200 * time.Millisecond,
		Log:            e.log.prefixed(name),
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		if err := cp.Stop(syscall.SIGTERM, 15*time.Second); err != nil {
			e.t.Errorf("control plane %s: %v", name, err)
		}
		cp.User.Close()
	})
	token, err := cp.AddHost(e.ctx, e.host)
	if err != nil {
		e.t.Fatal(err)
	}
	return cp, token
}

// sandboxCluster is the cluster identity the conversation's process
// sandbox recorded at its creation ("" if none).
func (e *env) sandboxCluster(convID string) string {
	e.t.Helper()
	raw, err := os.ReadFile(filepath.Join(fleet.SandboxDir(e.stateDir, convID), "cluster-id"))
	if err != nil {
		e.t.Fatalf("the sandbox of %s recorded no cluster: %v", convID, err)
	}
	return strings.TrimSpace(string(raw))
}

// K8 per sandbox, S3, end to end on the process backend: real control
// planes, the real daemon, real supervisors. A host runs two
// conversations' turns under cluster A; its sandboxes record A's identity
// (the one the host pinned). The host is then pointed at a new, empty
// database B — a new cluster — and runs two conversations of B there. B's
// deleted conversation is a positive tombstone from the cluster its
// sandbox was created under: the sweep removes it (supervisor gone,
// directory gone, one runnerd_sandbox_swept record, reason deleted). A's
// sandboxes, which B answers "unknown", are untouched round after round —
// the same supervisors running, their directories there — with one
// runnerd_sandbox_sweep_other_cluster record naming B and the two it may
// not judge; B's usable conversation keeps its sandbox.
func TestK8NewDatabaseSweepsOnlyItsOwnSandboxesProcess(t *testing.T) {
	t.Parallel()
	// Nothing here waits for a lease to run out: a calm lease keeps a
	// loaded machine's slow renewals from failing a turn the test needs.
	e := newEnv(t, envOpts{leaseTTL: calmLease})
	sweepEvery := func(c *fleet.DaemonConfig) {
		calm(c)
		c.Args = append(c.Args, "--sandbox-sweep", "200ms")
	}
	d := e.startDaemon(sweepEvery)

	var onA []wire.Conversation
	for _, title := range []string{"a-one", "a-two"} {
		c := e.conversation(title)
		if j := e.waitEnded(e.send(c.ID, "hello from A").ID); j.State != wire.JobSucceeded {
			t.Fatalf("turn of %s on A: %s", c.ID, describeJob(j))
		}
		onA = append(onA, c)
	}
	pinned, err := os.ReadFile(filepath.Join(e.stateDir, "cluster-id"))
	if err != nil {
		t.Fatalf("the host pinned no cluster: %v", err)
	}
	clusterA := strings.TrimSpace(string(pinned))
	supA := map[string]int{}
	for _, c := range onA {
		if got := e.sandboxCluster(c.ID); got != clusterA {
			t.Fatalf("the sandbox of %s recorded cluster %q, want A's %q", c.ID, got, clusterA)
		}
		p, ok := e.supervisorOf(c.ID)
		if !ok {
			t.Fatalf("no supervisor runs for %s after its turn", c.ID)
		}
		supA[c.ID] = p.Pid
	}

	// Moved to a new, empty database: stop the daemon, point it at B.
	d.Signal(syscall.SIGUSR1)
	if err := d.Wait(20 * time.Second); err != nil {
		t.Fatalf("the daemon did not drain: %v", err)
	}
	cpB, tokenB := e.freshControlPlane("cp-b", calmLease)
	d = e.startDaemon(func(c *fleet.DaemonConfig) {
		sweepEvery(c)
		c.ControlPlaneURL, c.HostTokenFile = cpB.URL, tokenB
	})
	mark := d.Mark()
	userB := cpB.User
	var onB []wire.Conversation
	for _, title := range []string{"b-kept", "b-deleted"} {
		c, err := userB.CreateConversation(e.ctx, title, bins.DemoAgent)
		if err != nil {
			t.Fatal(err)
		}
		j, err := userB.Send(e.ctx, c.ID, "hello from B")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := e.waitCtx()
		j, err = userB.WaitJob(ctx, j.ID, tick, "to end", func(j wire.Job) bool { return fleet.Ended(j.State) })
		cancel()
		if err != nil || j.State != wire.JobSucceeded {
			t.Fatalf("turn of %s on B: %v %s", c.ID, err, describeJob(j))
		}
		onB = append(onB, c)
	}
	kept, deleted := onB[0], onB[1]
	clusterB := e.sandboxCluster(kept.ID)
	if clusterB == "" || clusterB == clusterA || e.sandboxCluster(deleted.ID) != clusterB {
		t.Fatalf("B's sandboxes recorded clusters %q and %q; want B's, not A's %q", clusterB, e.sandboxCluster(deleted.ID), clusterA)
	}
	supDeleted, ok := e.supervisorOf(deleted.ID)
	if !ok {
		t.Fatal("no supervisor runs for B's conversation after its turn")
	}

	if cv, err := userB.Delete(e.ctx, deleted.ID); err != nil || cv.State != wire.ConversationDeleted {
		t.Fatalf("delete on B: %+v, %v", cv, err)
	}
	swept := regexp.MustCompile(`"msg":"runnerd_sandbox_swept".*"conversation_id":"` + regexp.QuoteMeta(deleted.ID) + `".*"reason":"deleted"`)
	if _, err := d.AwaitOutput(mark, swept, waitFor); err != nil {
		t.Fatalf("B's deleted conversation was not swept: %v\n%s", err, d.Output())
	}
	if _, err := waitGone(supDeleted.Pid, waitFor); err != nil {
		t.Fatalf("the supervisor of B's deleted conversation: %v", err)
	}
	if _, err := os.Stat(fleet.SandboxDir(e.stateDir, deleted.ID)); !os.IsNotExist(err) {
		t.Fatalf("the sandbox of B's deleted conversation is still there: %v", err)
	}
	// The round that swept it asked B about A's sandboxes too.
	other := regexp.MustCompile(`"msg":"runnerd_sandbox_sweep_other_cluster","cluster_id":"` + regexp.QuoteMeta(clusterB) + `","kept":2`)
	if _, err := d.AwaitOutput(mark, other, waitFor); err != nil {
		t.Fatalf("no record of the sandboxes B may not judge: %v\n%s", err, d.Output())
	}
	for _, c := range onA {
		p, ok := e.supervisorOf(c.ID)
		if !ok || p.Pid != supA[c.ID] {
			t.Errorf("A's conversation %s: supervisor %+v (running %v), want the same pid %d", c.ID, p, ok, supA[c.ID])
		}
		if _, err := os.Stat(fleet.Workspace(e.stateDir, c.ID)); err != nil {
			t.Errorf("A's conversation %s lost its workspace: %v", c.ID, err)
		}
	}
	if _, ok := e.supervisorOf(kept.ID); !ok {
		t.Error("B's usable conversation lost its supervisor")
	}
	if n := strings.Count(d.Output(), `"msg":"runnerd_sandbox_swept"`); n != 1 {
		t.Errorf("%d sweep records on B, want 1", n)
	}
}

// waitTurnOn sends prompt to conv on the control plane of user u and waits
// for its turn to succeed.
func (e *env) waitTurnOn(u *fleet.User, convID, prompt string) {
	e.t.Helper()
	j, err := u.Send(e.ctx, convID, prompt)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := e.waitCtx()
	defer cancel()
	j, err = u.WaitJob(ctx, j.ID, tick, "to end", func(j wire.Job) bool { return fleet.Ended(j.State) })
	if err != nil || j.State != wire.JobSucceeded {
		e.t.Fatalf("turn of %s: %v %s", convID, err, describeJob(j))
	}
}

// containerCluster is the cluster label of the conversation's one
// container, and its id and whether it runs.
func (e *dockerEnv) containerCluster(convID string) (cluster, id string, running bool) {
	e.t.Helper()
	ids := e.containers(convID)
	if len(ids) != 1 {
		e.t.Fatalf("conversation %s has containers %v, want one", convID, ids)
	}
	info, err := e.eng.ContainerInspect(e.ctx, ids[0])
	if err != nil {
		e.t.Fatal(err)
	}
	return info.Config.Labels[docker.LabelCluster], info.ID, info.State != nil && info.State.Running
}

// K8 per sandbox, S3, end to end on the Docker backend against the real
// engine: TestK8NewDatabaseSweepsOnlyItsOwnSandboxesProcess with
// containers. A's two conversations' containers carry A's identity
// (runnerd.cluster, the pinned one); moved to a new, empty database B,
// the host's container for B's deleted conversation is removed with its
// workspace volume, while A's containers — the same ids, still running —
// and their volumes stay on B's "unknown", and B's usable one keeps its.
func TestK8NewDatabaseSweepsOnlyItsOwnSandboxesDocker(t *testing.T) {
	t.Parallel()
	// A calm lease, as in the process case.
	e := newDockerEnv(t, envOpts{leaseTTL: calmLease}, "")
	dockerSweep := func(c *fleet.DaemonConfig) {
		calm(c)
		c.Sandbox = "docker"
		c.Args = append(c.Args, "--sandbox-sweep", "200ms")
	}
	d := e.startDaemon(dockerSweep)
	var onA []wire.Conversation
	for _, title := range []string{"a-one", "a-two"} {
		c := e.conversation(title)
		e.waitTurnOn(e.user, c.ID, "hello from A")
		onA = append(onA, c)
	}
	pinned, err := os.ReadFile(filepath.Join(e.stateDir, "cluster-id"))
	if err != nil {
		t.Fatalf("the host pinned no cluster: %v", err)
	}
	clusterA := strings.TrimSpace(string(pinned))
	idsA := map[string]string{}
	for _, c := range onA {
		cl, id, _ := e.containerCluster(c.ID)
		if cl != clusterA {
			t.Fatalf("the container of %s carries cluster %q, want A's %q", c.ID, cl, clusterA)
		}
		idsA[c.ID] = id
	}

	d.Signal(syscall.SIGUSR1)
	if err := d.Wait(20 * time.Second); err != nil {
		t.Fatalf("the daemon did not drain: %v", err)
	}
	cpB, tokenB := e.freshControlPlane("cp-b", calmLease)
	d = e.startDaemon(func(c *fleet.DaemonConfig) {
		dockerSweep(c)
		c.ControlPlaneURL, c.HostTokenFile = cpB.URL, tokenB
	})
	mark := d.Mark()
	var onB []wire.Conversation
	for _, title := range []string{"b-kept", "b-deleted"} {
		c, err := cpB.User.Create(e.ctx, wire.CreateConversationRequest{Title: title, Image: e.tag, AgentCommand: []string{"/demoagent"}})
		if err != nil {
			t.Fatal(err)
		}
		e.waitTurnOn(cpB.User, c.ID, "hello from B")
		onB = append(onB, c)
	}
	kept, deleted := onB[0], onB[1]
	clusterB, _, _ := e.containerCluster(kept.ID)
	if cl, _, _ := e.containerCluster(deleted.ID); clusterB == "" || clusterB == clusterA || cl != clusterB {
		t.Fatalf("B's containers carry clusters %q and %q; want B's, not A's %q", clusterB, cl, clusterA)
	}

	if cv, err := cpB.User.Delete(e.ctx, deleted.ID); err != nil || cv.State != wire.ConversationDeleted {
		t.Fatalf("delete on B: %+v, %v", cv, err)
	}
	swept := regexp.MustCompile(`"msg":"runnerd_sandbox_swept".*"conversation_id":"` + regexp.QuoteMeta(deleted.ID) + `".*"reason":"deleted"`)
	if _, err := d.AwaitOutput(mark, swept, waitFor); err != nil {
		t.Fatalf("B's deleted conversation was not swept: %v\n%s", err, d.Output())
	}
	if ids, vols := e.containers(deleted.ID), e.volumes(deleted.ID); len(ids) != 0 || len(vols) != 0 {
		t.Errorf("B's deleted conversation still has containers %v and volumes %v", ids, vols)
	}
	other := regexp.MustCompile(`"msg":"runnerd_sandbox_sweep_other_cluster","cluster_id":"` + regexp.QuoteMeta(clusterB) + `","kept":2`)
	if _, err := d.AwaitOutput(mark, other, waitFor); err != nil {
		t.Fatalf("no record of the sandboxes B may not judge: %v\n%s", err, d.Output())
	}
	for _, c := range onA {
		cl, id, running := e.containerCluster(c.ID)
		if id != idsA[c.ID] || !running || cl != clusterA || len(e.volumes(c.ID)) != 1 {
			t.Errorf("A's conversation %s: container %s (running %v, cluster %q), volumes %v; want %s running, its volume", c.ID, id, running, cl, e.volumes(c.ID), idsA[c.ID])
		}
	}
	if ids, vols := e.containers(kept.ID), e.volumes(kept.ID); len(ids) != 1 || len(vols) != 1 {
		t.Errorf("B's usable conversation has containers %v and volumes %v, want one of each", ids, vols)
	}
	if n := strings.Count(d.Output(), `"msg":"runnerd_sandbox_swept"`); n != 1 {
		t.Errorf("%d sweep records on B, want 1", n)
	}
}
