package storetest

import (
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// Host lifecycle. A paused host is given no new claim while
// its running turn goes on renewing and finishing, and claims again when
// resumed; a rotated token refuses the old one; a removed host's token is
// refused, it leaves the list, its heartbeats are not recorded, and its
// name registers it anew with its old id. Unknown names are ErrNotFound.
func testHostLifecycle(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	conv1, conv2 := f.conversation(), f.conversation()
	j1, j2 := f.enqueue(conv1.ID, "one"), f.enqueue(conv2.ID, "two")
	running := f.claimOn(f.host, T0, j1.ID)

	if err := st.PauseHost(f.ctx, "host-a", true, Operator, at(time.Second)); err != nil {
		t.Fatalf("PauseHost: %v", err)
	}
	if err := st.PauseHost(f.ctx, "host-a", true, Operator, at(2*time.Second)); err != nil {
		t.Fatalf("PauseHost again: %v", err)
	}
	if h, err := st.HostByTokenHash(f.ctx, Hash("host-token-host-a")); err != nil || !h.Paused {
		t.Fatalf("paused host = %+v, %v", h, err)
	}
	f.claimOn(f.host, at(3*time.Second), "")
	if _, err := st.Renew(f.ctx, ref(running), TTL, at(4*time.Second)); err != nil {
		t.Fatalf("a paused host's running turn could not renew: %v", err)
	}
	if _, err := st.Finish(f.ctx, ref(running), wire.FinishRequest{AttemptRef: ref(running), Outcome: wire.OutcomeFailed, Class: "agent_exit"}, at(5*time.Second)); err != nil {
		t.Fatalf("a paused host's running turn could not finish: %v", err)
	}
	servers, err := st.ListServers(f.ctx)
	if err != nil || len(servers) != 1 || servers[0].PausedAt == nil || !servers[0].PausedAt.Equal(at(time.Second)) {
		t.Fatalf("ListServers of a paused host = %+v, %v; want paused since the first pause", servers, err)
	}
	if err := st.PauseHost(f.ctx, "host-a", false, Operator, at(6*time.Second)); err != nil {
		t.Fatalf("resume: %v", err)
	}
	f.claimOn(f.host, at(7*time.Second), j2.ID)

	if err := st.RecordHostHeartbeat(f.ctx, f.host.ID, wire.HostHeartbeat{Capacity: 2, IntervalMS: 5000, ClaimsWithheld: "sandbox_unavailable"}, at(8*time.Second)); err != nil {
		t.Fatal(err)
	}
	servers, _ = st.ListServers(f.ctx)
	if s := servers[0]; s.PausedAt != nil || s.HeartbeatIntervalMS != 5000 || s.ClaimsWithheld != "sandbox_unavailable" {
		t.Fatalf("server after resume and heartbeat = %+v", s)
	}

	if err := st.RotateHostToken(f.ctx, "host-a", store.HostRotation{TokenHash: Hash("rotated")}, Operator, at(9*time.Second)); err != nil {
		t.Fatalf("RotateHostToken: %v", err)
	}
	_, err = st.HostByTokenHash(f.ctx, Hash("host-token-host-a"))
	wantErr(t, "the token before rotation", err, store.ErrUnauthorized)
	if h, err := st.HostByTokenHash(f.ctx, Hash("rotated")); err != nil || h.ID != f.host.ID {
		t.Fatalf("rotated token = %+v, %v", h, err)
	}

	b := f.newHost("host-b")
	if err := st.RemoveHost(f.ctx, "host-a", Operator, at(10*time.Second)); err != nil {
		t.Fatalf("RemoveHost: %v", err)
	}
	_, err = st.HostByTokenHash(f.ctx, Hash("rotated"))
	wantErr(t, "a removed host's token", err, store.ErrUnauthorized)
	wantErr(t, "a removed host's heartbeat", st.RecordHostHeartbeat(f.ctx, f.host.ID, wire.HostHeartbeat{}, at(11*time.Second)), store.ErrNotFound)
	f.enqueue(f.conversation().ID, "three")
	f.claimOn(f.host, at(11*time.Second), "")
	if servers, err := st.ListServers(f.ctx); err != nil || len(servers) != 1 || servers[0].Name != b.Name {
		t.Fatalf("ListServers after the removal = %+v, %v", servers, err)
	}
	if j, err := st.GetJob(f.ctx, j1.ID); err != nil || j.Attempts[0].LeaseOwner != "host-a" {
		t.Fatalf("the removed host's attempt = %+v, %v", j.Attempts, err)
	}
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"PauseHost", st.PauseHost(f.ctx, "host-a", true, Operator, at(12*time.Second))},
		{"RotateHostToken", st.RotateHostToken(f.ctx, "host-a", store.HostRotation{TokenHash: Hash("x")}, Operator, at(12*time.Second))},
		{"RemoveHost", st.RemoveHost(f.ctx, "host-a", Operator, at(12*time.Second))},
		{"PauseHost(unknown)", st.PauseHost(f.ctx, "nobody", false, Operator, at(12*time.Second))},
	} {
		wantErr(t, tc.name+" of a removed or unknown host", tc.err, store.ErrNotFound)
	}

	again, err := st.CreateHost(f.ctx, "host-a", Hash("fresh"), Operator, at(13*time.Second))
	if err != nil || again.ID != f.host.ID {
		t.Fatalf("CreateHost of a removed name = %+v, %v; want the old id %s", again, err, f.host.ID)
	}
	if h, err := st.HostByTokenHash(f.ctx, Hash("fresh")); err != nil || h.ID != f.host.ID || h.Paused {
		t.Fatalf("re-registered host = %+v, %v", h, err)
	}
	servers, _ = st.ListServers(f.ctx)
	if len(servers) != 2 || servers[0].LastHeartbeat != nil || servers[0].ClaimsWithheld != "" {
		t.Fatalf("re-registered host kept what it last said: %+v", servers)
	}
}
