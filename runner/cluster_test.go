package runner

import (
	"context"
	"encoding/json"
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
// cluster removes the sandbox. A control plane on a fresh database at the
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
