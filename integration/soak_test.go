package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/sandbox/docker"
	"github.com/runnerd/runnerd/wire"
)

// The soak's size and pace: soakConversations conversations, one turn each
// and then a second, on one host of soakCapacity turns at a time, with
// soakIdle as --sandbox-idle.
const (
	soakConversations = 200
	soakCapacity      = 8
	soakIdle          = 2 * time.Second
	// soakMemorySlack is how far from the idle baseline the host's
	// memory may be once every sandbox is evicted: a ratio, never a time.
	soakMemorySlack = 0.10
)

// soakCalm is the soak's daemon beyond calm's lease: receipt tries and
// control calls given seconds, not the harness's scaled-down half second,
// so that a turn among many on a loaded machine is not failed by a slow
// receipt answer — the soak judges memory and sessions, not R24's retry.
func soakCalm(c *fleet.DaemonConfig) {
	calm(c)
	c.ReceiptTimeout, c.ReceiptRetry, c.ControlTimeout = 5*time.Second, 200*time.Millisecond, 5*time.Second
}

// hostMemory is what the soak measures of the host: the resident memory
// (VmRSS) summed over every live process of this test — the daemon, its
// turn children, the supervisors and their agents (procs) — and, of
// those, the supervisors' and agents' (the retained sandboxes') and how
// many supervisors run.
func (e *env) hostMemory() (kib, sandboxKiB, supervisors int) {
	ps := e.procs()
	var sandboxes []int
	for _, p := range ps {
		switch {
		case len(p.Argv) > 1 && p.Argv[0] == e.runnerd && p.Argv[1] == "supervise":
			supervisors++
			sandboxes = append(sandboxes, p.Pid)
		case p.Argv[0] == bins.DemoAgent:
			sandboxes = append(sandboxes, p.Pid)
		}
	}
	return rssKiB(pidsOf(ps)), rssKiB(sandboxes), supervisors
}

// turnsHeld counts this test's live turn children: the turns the host
// holds now.
func (e *env) turnsHeld() int { return len(e.turnChildren()) }

// sendAll sends prompt to every conversation at once, waits for every
// job to end, and returns each job and how long its one attempt took from
// its claim to its end on the control plane's clock (queueing left out).
func (e *env) sendAll(convs []wire.Conversation, prompt string) ([]wire.Job, []time.Duration) {
	e.t.Helper()
	jobs := make([]wire.Job, len(convs))
	took := make([]time.Duration, len(convs))
	for i, c := range convs {
		jobs[i] = e.send(c.ID, prompt)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(convs))
	for i := range convs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(e.ctx, 10*time.Minute) // the whole batch's bound, not a turn's
			defer cancel()
			j, err := e.user.WaitJob(ctx, jobs[i].ID, tick, "to end", func(j wire.Job) bool { return fleet.Ended(j.State) })
			jobs[i], errs[i] = j, err
			if err == nil && len(j.Attempts) == 1 && j.Attempts[0].EndedAt != nil {
				took[i] = j.Attempts[0].EndedAt.Sub(j.Attempts[0].ClaimedAt)
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			e.t.Fatalf("%v; job now: %s", err, describeJob(jobs[i]))
		}
	}
	return jobs, took
}

// allEvicted waits until no supervisor of this test runs and no turn is
// held, and returns the memory of a retained sandbox (supervisor and
// agent) before its eviction — the sandboxes' memory over their number,
// at the moment the most of them ran — and that number.
func (e *env) allEvicted() (perSandboxKiB, most int) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Minute)
	defer cancel()
	err := fleet.Poll(ctx, tick, "every sandbox evicted", func(context.Context) (bool, error) {
		_, sandboxKiB, n := e.hostMemory()
		if n > most {
			most, perSandboxKiB = n, sandboxKiB/n
		}
		return n == 0 && e.turnsHeld() == 0, nil
	})
	if err != nil {
		_, _, n := e.hostMemory()
		e.t.Fatalf("%v: %d supervisors still run, %d turns held", err, n, e.turnsHeld())
	}
	return perSandboxKiB, most
}

// recordedConversations are the conversations of the daemon's records
// named msg, read once from the test's output log.
func (e *env) recordedConversations(msg string) map[string]bool {
	e.t.Helper()
	raw, err := os.ReadFile(filepath.Join(e.dir, "output.log"))
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]bool{}
	for _, line := range strings.Split(string(raw), "\n") {
		_, rec, ok := strings.Cut(line, "runnerd| ")
		if !ok || !strings.Contains(rec, `"msg":"`+msg+`"`) {
			continue
		}
		var r struct {
			Conv string `json:"conversation_id"`
		}
		if json.Unmarshal([]byte(rec), &r) == nil && r.Conv != "" {
			out[r.Conv] = true
		}
	}
	return out
}

// percentile is the p-th percentile (0 < p ≤ 1) of ds, nearest rank.
func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

// The soak (S1 at fleet scale), process backend: soakConversations
// conversations, one turn each, run soakCapacity at a time on one host
// with --sandbox-idle 2s. Once every sandbox is evicted, (1) the host's
// memory — the resident memory of all this test's processes: daemon, turn
// children, supervisors, agents — is back to its idle baseline within
// soakMemorySlack of it (a ratio); the baseline is the idle host after a
// warm-up of 2×soakCapacity conversations, evicted, so what is judged is
// whether soakConversations idle conversations cost more than a few;
// (2) no supervisor runs and no turn is held. Every conversation's second
// turn then wakes its sandbox and resumes its native session: the agent's
// transcript shows the first prompt and then the second, at native turns
// 1 and 2, and the conversation is at native turn 2. After the second
// round's evictions (1) and (2) hold again. The figures — memory per
// sandbox before and after eviction, the soak's duration, the second
// turns' send-to-end times — are logged, not asserted.
func TestS1SoakIdleEvictionProcess(t *testing.T) {
	t.Parallel() // it measures only its own processes, and overlaps the package's other tests within make test's bound
	began := time.Now()
	e := newEnv(t, envOpts{leaseTTL: calmLease})
	e.startDaemon(func(c *fleet.DaemonConfig) {
		soakCalm(c)
		c.Capacity = soakCapacity
		c.Args = append(c.Args, "--sandbox-idle="+soakIdle.String())
	})
	e.waitServer("to be online", func(s wire.Server) bool { return wire.HostState(s, time.Now()) == wire.HostOnline })
	cold, _, _ := e.hostMemory()
	// The idle baseline is the host idle after a warm-up: two turns at a
	// time for each of its turn slots, evicted. A daemon that never ran a
	// turn has not yet grown the heap that running soakCapacity turns at
	// once needs, whatever their number; the soak's question is whether
	// soakConversations idle conversations cost more than that.
	warm := make([]wire.Conversation, 2*soakCapacity)
	for i := range warm {
		warm[i] = e.conversation(fmt.Sprintf("warm-up %d", i))
	}
	if jobs, _ := e.sendAll(warm, "warm up"); !slices.ContainsFunc(jobs, func(j wire.Job) bool { return j.State == wire.JobSucceeded }) {
		t.Fatalf("no warm-up turn succeeded: %s", describeJob(jobs[0]))
	}
	e.allEvicted()
	baseline, _, _ := e.hostMemory()
	if baseline == 0 {
		t.Fatal("no memory measured for the idle host")
	}
	t.Logf("idle host: %d KiB before any turn, %d KiB after %d warm-up conversations evicted (the baseline)", cold, baseline, len(warm))
	within := func(round string) int {
		t.Helper()
		kib, _, n := e.hostMemory()
		ratio := float64(kib) / float64(baseline)
		t.Logf("%s: host memory %d KiB, %.2f× the idle baseline of %d KiB; %d supervisors", round, kib, ratio, baseline, n)
		if ratio > 1+soakMemorySlack || ratio < 1-soakMemorySlack {
			t.Errorf("%s: host memory %d KiB is %.2f× the idle baseline %d KiB, want within ±%.0f %%", round, kib, ratio, baseline, soakMemorySlack*100)
		}
		return kib
	}

	convs := make([]wire.Conversation, soakConversations)
	for i := range convs {
		convs[i] = e.conversation(fmt.Sprintf("soak %d", i))
	}
	first, created := e.sendAll(convs, "remember the soak")
	for i, j := range first {
		if j.State != wire.JobSucceeded {
			t.Fatalf("first turn of %s: %s", convs[i].ID, describeJob(j))
		}
	}
	firstDone := time.Since(began)
	perSandbox, most := e.allEvicted()
	after := within("after the first turns' eviction")
	t.Logf("first turns of %d conversations done in %v; at most %d supervisors ran at once, %d KiB each (supervisor and agent) before eviction; after eviction %.1f KiB per idle conversation (the host's memory above its baseline, over %d)",
		soakConversations, firstDone.Round(time.Second), most, perSandbox, float64(after-baseline)/soakConversations, soakConversations)

	second, took := e.sendAll(convs, "what did I say?")
	for i, j := range second {
		if j.State != wire.JobSucceeded {
			t.Fatalf("second turn of %s: %s", convs[i].ID, describeJob(j))
		}
	}
	wokenIn := e.recordedConversations(diagnostics.MsgSandboxWoken)
	woken := 0
	for _, c := range convs {
		e.assertPromptsOnce(c.ID, "remember the soak", "what did I say?")
		if cv := e.conv(c.ID); cv.State != wire.ConversationUsable || cv.NativeTurn != 2 {
			t.Errorf("conversation %s after its second turn: %s at native turn %d, want usable at 2", c.ID, cv.State, cv.NativeTurn)
		}
		if wokenIn[c.ID] {
			woken++
		}
	}
	if woken != soakConversations {
		t.Errorf("%d of %d second turns woke a stopped sandbox (sandbox_woken)", woken, soakConversations)
	}
	t.Logf("claim to end, %d turns at a time: first turns (creating the sandbox) p50 %v, p95 %v; second turns (waking it) p50 %v, p95 %v",
		soakCapacity, percentile(created, 0.5).Round(time.Millisecond), percentile(created, 0.95).Round(time.Millisecond),
		percentile(took, 0.5).Round(time.Millisecond), percentile(took, 0.95).Round(time.Millisecond))

	e.allEvicted()
	within("after the second turns' eviction")
	t.Logf("the soak: %d conversations, two turns each, in %v", soakConversations, time.Since(began).Round(time.Second))
}

// runningContainers counts this host's sandbox containers the engine
// reports running.
func (e *dockerEnv) runningContainers() int {
	e.t.Helper()
	list, err := e.eng.ContainerList(e.ctx, container.ListOptions{Filters: filters.NewArgs(
		filters.Arg("label", docker.LabelHost+"="+e.host),
		filters.Arg("status", "running"),
	)})
	if err != nil {
		e.t.Fatal(err)
	}
	return len(list)
}

// The soak's smaller Docker variant: soakDockerConversations
// conversations, one turn each, soakDockerCapacity at a time, with
// --sandbox-idle 2s, against the real engine. After eviction no container
// of this host runs (a stopped container holds no memory: its processes
// are gone, as the engine reports) and the host's own processes — the
// daemon and its turn children — are back within soakMemorySlack of the
// warmed idle baseline; every second turn starts the same retained
// container again and resumes its native session (the agent's transcript
// in the container holds both prompts once each; native turn 2); after
// the second round's evictions nothing runs again.
func TestS1SoakIdleEvictionDocker(t *testing.T) {
	t.Parallel()
	const (
		soakDockerConversations = 24
		soakDockerCapacity      = 4
	)
	began := time.Now()
	e := newDockerEnv(t, envOpts{leaseTTL: calmLease}, "")
	e.startDaemon(func(c *fleet.DaemonConfig) {
		soakCalm(c)
		c.Sandbox = "docker"
		c.Capacity = soakDockerCapacity
		c.Args = append(c.Args, "--sandbox-sweep", "0", "--sandbox-idle="+soakIdle.String())
	})
	e.waitServer("to be online", func(s wire.Server) bool { return wire.HostState(s, time.Now()) == wire.HostOnline })
	evicted := func(round string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(e.ctx, 10*time.Minute)
		defer cancel()
		if err := fleet.Poll(ctx, tick, "every container stopped", func(context.Context) (bool, error) {
			return e.runningContainers() == 0 && e.turnsHeld() == 0, nil
		}); err != nil {
			t.Fatalf("%s: %v: %d containers run, %d turns held", round, err, e.runningContainers(), e.turnsHeld())
		}
	}
	warm := make([]wire.Conversation, 2*soakDockerCapacity)
	for i := range warm {
		warm[i] = e.conversation(fmt.Sprintf("warm-up %d", i))
	}
	e.sendAll(warm, "warm up")
	evicted("the warm-up")
	baseline, _, _ := e.hostMemory()
	within := func(round string) {
		t.Helper()
		kib, _, _ := e.hostMemory()
		ratio := float64(kib) / float64(baseline)
		t.Logf("%s: the host's own processes %d KiB, %.2f× the idle baseline of %d KiB; no container runs", round, kib, ratio, baseline)
		if ratio > 1+soakMemorySlack || ratio < 1-soakMemorySlack {
			t.Errorf("%s: %d KiB is %.2f× the idle baseline %d KiB, want within ±%.0f %%", round, kib, ratio, baseline, soakMemorySlack*100)
		}
	}

	convs := make([]wire.Conversation, soakDockerConversations)
	for i := range convs {
		convs[i] = e.conversation(fmt.Sprintf("docker soak %d", i))
	}
	first, created := e.sendAll(convs, "remember the soak")
	retained := make([]string, len(convs))
	for i, j := range first {
		if j.State != wire.JobSucceeded {
			t.Fatalf("first turn of %s: %s", convs[i].ID, describeJob(j))
		}
		retained[i] = e.conv(convs[i].ID).ContainerID
	}
	evicted("after the first turns")
	within("after the first turns' eviction")

	second, took := e.sendAll(convs, "what did I say?")
	for i, j := range second {
		if j.State != wire.JobSucceeded {
			t.Fatalf("second turn of %s: %s", convs[i].ID, describeJob(j))
		}
		cv := e.conv(convs[i].ID)
		if cv.ContainerID != retained[i] || cv.NativeTurn != 2 || cv.State != wire.ConversationUsable {
			t.Errorf("conversation %s after its second turn: container %.12s at native turn %d (%s), want the retained %.12s at 2, usable", cv.ID, cv.ContainerID, cv.NativeTurn, cv.State, retained[i])
		}
		if got := containerTranscript(t, e.eng, retained[i]); !slices.Equal(got, []string{"remember the soak", "what did I say?"}) {
			t.Errorf("the agent of %s received %q, want each prompt once", cv.ID, got)
		}
	}
	t.Logf("docker, claim to end, %d turns at a time: first turns (creating the container) p50 %v, p95 %v; second turns (starting it again) p50 %v, p95 %v",
		soakDockerCapacity, percentile(created, 0.5).Round(time.Millisecond), percentile(created, 0.95).Round(time.Millisecond),
		percentile(took, 0.5).Round(time.Millisecond), percentile(took, 0.95).Round(time.Millisecond))
	evicted("after the second turns")
	within("after the second turns' eviction")
	t.Logf("the docker soak: %d conversations, two turns each, in %v", soakDockerConversations, time.Since(began).Round(time.Second))
}
