package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/process"
	"github.com/runnerd/runnerd/wire"
)

// switchboard serves whichever control plane is plugged in: two databases
// behind one address, as after a wrong DSN or a restore.
type switchboard struct{ cur atomic.Pointer[cp] }

func (s *switchboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.cur.Load().srv.Handler().ServeHTTP(w, r)
}

// clusterRefusals lists the decision and identity of each cluster record.
func (l *logBuf) clusterRefusals(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(l.String()), "\n") {
		var r struct {
			Msg             string `json:"msg"`
			Decision        string `json:"decision"`
			ClusterID       string `json:"cluster_id"`
			PinnedClusterID string `json:"pinned_cluster_id"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("record %q: %v", line, err)
		}
		if r.Msg == MsgClusterChanged {
			out = append(out, r.Decision+" "+r.PinnedClusterID+" -> "+r.ClusterID)
		}
	}
	return out
}

// K8: the daemon pins the control plane's cluster identity at first contact
// (a 0600 file in its state directory), and a LOST tombstone from that
// cluster removes a sandbox that recorded no cluster of its own (made by
// an earlier release: ensureSandbox records none). A control plane on a fresh database at the
// same address — which knows none of the host's conversations and even has
// a LOST one of its own whose id the host holds — removes nothing: not on a
// host heartbeat, not in any sweep round, not after the daemon restarts;
// one runnerd_cluster_changed record says so. When the pinned cluster
// answers again, its tombstones remove again.
func TestK8FreshDatabaseRemovesNothing(t *testing.T) {
	ctx := context.Background()
	pinned, fresh := newCP(t), newCP(t)
	// The fresh database accepts the host's token: the dangerous case.
	if _, err := fresh.st.CreateHost(ctx, "host-a-again", controlplane.HashToken(pinned.hostToken), store.Audit{Actor: "test"}, fresh.now()); err != nil {
		t.Fatal(err)
	}
	sw := &switchboard{}
	sw.cur.Store(pinned)
	hs := httptest.NewServer(sw)
	t.Cleanup(hs.Close)
	state := t.TempDir()
	be := newProcessBackend(t, state)
	daemon := func() (*Daemon, *logBuf) {
		return newTestDaemon(t, pinned, func(cfg *Config) { cfg.StateDir = state; cfg.Backend = be; cfg.ControlPlaneURL = hs.URL })
	}
	d, logs := daemon()
	s := sweeper{d: d, lister: be}

	lost, usable := pinned.lostConversation(), pinned.usableConversation()
	lostPid, usablePid := ensureSandbox(t, be, lost), ensureSandbox(t, be, usable)
	s.round(ctx)
	if alive(lostPid) || !alive(usablePid) {
		t.Fatalf("first contact: LOST supervisor alive %v, usable alive %v", alive(lostPid), alive(usablePid))
	}
	id, err := pinned.st.ClusterID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pin := filepath.Join(state, clusterFile)
	raw, err := os.ReadFile(pin)
	if err != nil || strings.TrimSpace(string(raw)) != id {
		t.Fatalf("pin file holds %q (%v), want %q", raw, err, id)
	}
	if fi, err := os.Stat(pin); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("pin file mode %v (%v), want 0600", fi.Mode(), err)
	}

	// A fresh database at the same address.
	sw.cur.Store(fresh)
	freshLost := fresh.lostConversation()
	freshPid := ensureSandbox(t, be, freshLost)
	if err := d.sendHostBeat(ctx, false); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		s.round(ctx)
	}
	if !alive(usablePid) || !alive(freshPid) {
		t.Fatalf("a fresh database removed a sandbox: usable alive %v, its own LOST one alive %v", alive(usablePid), alive(freshPid))
	}
	freshID, _ := fresh.st.ClusterID(ctx)
	if got, want := logs.clusterRefusals(t), []string{clusterChanged + " " + id + " -> " + freshID}; !slices.Equal(got, want) {
		t.Fatalf("cluster records %v, want once %v\n%s", got, want, logs)
	}
	// The pin outlives the daemon.
	d2, logs2 := daemon()
	(&sweeper{d: d2, lister: be}).round(ctx)
	if !alive(usablePid) || !alive(freshPid) || len(logs2.clusterRefusals(t)) != 1 {
		t.Fatalf("restarted daemon: usable alive %v, fresh LOST alive %v, records %v", alive(usablePid), alive(freshPid), logs2.clusterRefusals(t))
	}

	// The pinned cluster again: its tombstones remove.
	sw.cur.Store(pinned)
	lost2 := pinned.lostConversation()
	lost2Pid := ensureSandbox(t, be, lost2)
	s.round(ctx)
	if alive(lost2Pid) || !alive(usablePid) || !alive(freshPid) {
		t.Fatalf("pinned again: its LOST alive %v, usable alive %v, unknown to it alive %v", alive(lost2Pid), alive(usablePid), alive(freshPid))
	}
	if got, want := logs.swept(t), sortedOf(lost+" lost process", lost2+" lost process"); !slices.Equal(got, want) {
		t.Fatalf("swept %v, want %v", got, want)
	}
	logs.noSecrets(t, pinned.hostToken)
}

// K8: what the pin trusts. The first identity is pinned; only it is
// trusted after that, also by a pin read again from its file; no identity
// at all, or a pin file that cannot be read, trusts nothing.
func TestK8ClusterPin(t *testing.T) {
	dir := t.TempDir()
	p := loadClusterPin(dir)
	for _, step := range []struct{ id, why string }{
		{"", clusterNone},
		{"cluster_a", ""},
		{"cluster_a", ""},
		{"cluster_b", clusterChanged},
		{"", clusterNone},
	} {
		if _, why := p.check(step.id); why != step.why {
			t.Fatalf("check(%q) = %q, want %q", step.id, why, step.why)
		}
	}
	if _, why := loadClusterPin(dir).check("cluster_b"); why != clusterChanged {
		t.Fatalf("reloaded pin: check(cluster_b) = %q, want %q", why, clusterChanged)
	}
	if err := os.WriteFile(filepath.Join(dir, clusterFile), []byte("not an identity\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, why := loadClusterPin(dir).check("cluster_a"); why != clusterUnreadable {
		t.Fatalf("unreadable pin: check = %q, want %q", why, clusterUnreadable)
	}
}

// ensureSandboxIn is ensureSandbox for a sandbox created under cluster,
// as a turn the cluster granted creates it (sandbox.SpecFromClaim).
func ensureSandboxIn(t *testing.T, b *process.Backend, conv, cluster string) int {
	t.Helper()
	ctx := context.Background()
	t.Cleanup(func() { _ = b.Remove(context.Background(), conv) })
	sb, err := b.Ensure(ctx, sandbox.SpecFromClaim(wire.Claim{ClusterID: cluster, Turn: wire.Turn{ConversationID: conv, AgentCommand: []string{"true"}}}))
	if err != nil {
		t.Fatal(err)
	}
	st, err := sb.Client().Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st.PID
}

// K8 per sandbox, S3: a host moved from cluster A to a new, empty
// database B, on the real control planes and the real process backend.
// Each sandbox is judged only by the cluster it was created under: B's
// LOST conversation's sandbox is swept on B's word although the host
// pinned A; A's sandboxes — usable, or LOST meanwhile on A — are kept on
// B's "unknown", round after round and after a restart, one record saying
// so; a sandbox that recorded no cluster (an earlier release's) is judged
// under the host's pin as before, so B's LOST answer about it removes
// nothing. Back on A, A's tombstone removes A's LOST one, and B's usable
// one is kept on A's "unknown".
func TestK8PerSandboxClusterJudgesOnlyItsOwn(t *testing.T) {
	ctx := context.Background()
	a, b := newCP(t), newCP(t)
	if _, err := b.st.CreateHost(ctx, "host-a-again", controlplane.HashToken(a.hostToken), store.Audit{Actor: "test"}, b.now()); err != nil {
		t.Fatal(err)
	}
	idA, errA := a.st.ClusterID(ctx)
	idB, errB := b.st.ClusterID(ctx)
	if errA != nil || errB != nil || idA == idB {
		t.Fatalf("cluster ids %q (%v), %q (%v): want two", idA, errA, idB, errB)
	}
	sw := &switchboard{}
	sw.cur.Store(a)
	hs := httptest.NewServer(sw)
	t.Cleanup(hs.Close)
	state := t.TempDir()
	be := newProcessBackend(t, state)
	daemon := func() (*Daemon, *logBuf) {
		return newTestDaemon(t, a, func(cfg *Config) { cfg.StateDir = state; cfg.Backend = be; cfg.ControlPlaneURL = hs.URL })
	}
	d, logs := daemon()
	s := sweeper{d: d, lister: be}

	aLost, aUsable, aLater := a.lostConversation(), a.usableConversation(), a.usableConversation()
	pid := map[string]int{}
	for _, c := range []string{aLost, aUsable, aLater} {
		pid[c] = ensureSandboxIn(t, be, c, idA)
	}
	if err := d.sendHostBeat(ctx, false); err != nil { // first contact pins A
		t.Fatal(err)
	}
	s.round(ctx) // A's tombstone removes A's LOST one
	if alive(pid[aLost]) || !alive(pid[aUsable]) || !alive(pid[aLater]) {
		t.Fatalf("on A: LOST alive %v, usable alive %v %v", alive(pid[aLost]), alive(pid[aUsable]), alive(pid[aLater]))
	}

	// Moved to B. aLater becomes LOST on A while the host talks to B.
	sw.cur.Store(b)
	bLost, bUsable, legacy := b.lostConversation(), b.usableConversation(), b.lostConversation()
	for _, c := range []string{bLost, bUsable} {
		pid[c] = ensureSandboxIn(t, be, c, idB)
	}
	pid[legacy] = ensureSandbox(t, be, legacy) // recorded no cluster
	lostOnA := func(conv string) {
		t.Helper()
		j, err := a.st.EnqueueTurn(ctx, conv, "later", a.now())
		if err != nil {
			t.Fatal(err)
		}
		cl := a.claim(testTimings.LeaseTTL)
		if cl.JobID != j.ID {
			t.Fatalf("claimed %s, want %s", cl.JobID, j.ID)
		}
		ref := wire.AttemptRef{AttemptID: cl.AttemptID, LeaseGeneration: cl.LeaseGeneration}
		if _, err := a.wc.Admission(ctx, cl.WorkerToken, cl.JobID, wire.AdmissionRequest{AttemptRef: ref, ActivationID: "act-1"}); err != nil {
			t.Fatal(err)
		}
		if resp, err := a.wc.Finish(ctx, cl.WorkerToken, cl.JobID, wire.FinishRequest{AttemptRef: ref, Outcome: wire.OutcomeFailed, Class: "workspace_missing", Unrecoverable: true}); err != nil || resp.ConversationState != wire.ConversationLost {
			t.Fatalf("finish: %+v, %v; want the conversation lost", resp, err)
		}
	}
	lostOnA(aLater)
	if err := d.sendHostBeat(ctx, false); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		s.round(ctx)
	}
	if alive(pid[bLost]) {
		t.Errorf("B's LOST conversation's supervisor still runs: the new cluster's tombstone removed nothing")
	}
	if _, err := os.Stat(be.Dir(bLost)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("B's LOST conversation's sandbox is still there: %v", err)
	}
	for _, c := range []string{aUsable, aLater, bUsable, legacy} {
		if !alive(pid[c]) {
			t.Errorf("the supervisor of %s was stopped on B's word", c)
		}
	}
	if got, want := logs.otherCluster(t), []string{idB + " 3"}; !slices.Equal(got, want) {
		t.Errorf("other-cluster records %v, want once %v\n%s", got, want, logs)
	}
	if got, want := logs.clusterRefusals(t), []string{clusterChanged + " " + idA + " -> " + idB}; !slices.Equal(got, want) {
		t.Errorf("cluster records %v, want once %v", got, want)
	}

	// A restarted daemon judges by the same records (they are on disk).
	d2, _ := daemon()
	(&sweeper{d: d2, lister: be}).round(ctx)
	for _, c := range []string{aUsable, aLater, bUsable, legacy} {
		if !alive(pid[c]) {
			t.Errorf("after a restart, the supervisor of %s was stopped on B's word", c)
		}
	}

	// Back on A: its tombstone removes aLater; B's usable one is unknown
	// to A and kept; the legacy one is unknown to A and kept.
	sw.cur.Store(a)
	s.round(ctx)
	if alive(pid[aLater]) {
		t.Errorf("A's LOST conversation's supervisor still runs back on A")
	}
	for _, c := range []string{aUsable, bUsable, legacy} {
		if !alive(pid[c]) {
			t.Errorf("the supervisor of %s was stopped back on A", c)
		}
	}
	want := sortedOf(aLost+" lost process", bLost+" lost process", aLater+" lost process")
	if got := logs.swept(t); !slices.Equal(got, want) {
		t.Errorf("swept %v, want %v", got, want)
	}
	logs.noSecrets(t, a.hostToken)
}

// K8 per sandbox: which answers may judge a sandbox. Only the cluster it
// was created under; one that recorded none, the host's pinned cluster
// only; a control plane sending no identity, none; an unreadable record,
// none.
func TestK8JudgesOnlyTheSandboxCluster(t *testing.T) {
	for _, tc := range []struct {
		created, answering string
		pinned, want       bool
	}{
		{"cl_a", "cl_a", true, true},
		{"cl_a", "cl_a", false, true}, // the host pinned another: still A's own
		{"cl_a", "cl_b", true, false},
		{"cl_a", "cl_b", false, false},
		{"cl_a", "", false, false},
		{"", "cl_a", true, true},
		{"", "cl_b", false, false},
		{"", "", false, false},
		{sandbox.ClusterUnreadable, sandbox.ClusterUnreadable, false, true}, // unreachable: no control plane sends a "/"
		{sandbox.ClusterUnreadable, "cl_a", true, false},
	} {
		if got := judges(tc.created, tc.answering, tc.pinned); got != tc.want {
			t.Errorf("judges(%q, %q, pinned %v) = %v, want %v", tc.created, tc.answering, tc.pinned, got, tc.want)
		}
	}
}

// otherCluster lists the cluster and count of each MsgSweepOtherCluster.
func (l *logBuf) otherCluster(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(l.String()), "\n") {
		var r struct {
			Msg       string `json:"msg"`
			ClusterID string `json:"cluster_id"`
			Kept      int    `json:"kept"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("record %q: %v", line, err)
		}
		if r.Msg == MsgSweepOtherCluster {
			out = append(out, fmt.Sprintf("%s %d", r.ClusterID, r.Kept))
		}
	}
	return out
}
