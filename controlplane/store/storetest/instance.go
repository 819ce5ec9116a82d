package storetest

import (
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// Two daemon instances presenting one host token, as a rule
// of the store's clock: another instance is refused ErrHostTokenInUse
// while the live one's last heartbeat is within the host's offline bound
// (3 intervals), and recorded as the host's conflict; a claim of the
// refused one is refused too and takes nothing over; past the bound, or
// once the live one's heartbeat said it stops, or at once for a new
// instance with the live one's boot id (that machine's restart), the
// newcomer takes over and its conflict is cleared.
func testHostInstance(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	beat := func(in store.Instance, when time.Time) error {
		t.Helper()
		if err := st.UseHostInstance(f.ctx, f.host.ID, in, true, when); err != nil {
			return err
		}
		return st.RecordHostHeartbeat(f.ctx, f.host.ID, wire.HostHeartbeat{Capacity: 1, IntervalMS: 1000}, when)
	}
	server := func() wire.Server {
		t.Helper()
		ss, err := st.ListServers(f.ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range ss {
			if s.Name == "host-a" {
				return s
			}
		}
		t.Fatal("no host-a")
		return wire.Server{}
	}
	a := store.Instance{ID: "inst-a", BootID: "boot-a"}
	b := store.Instance{ID: "inst-b", BootID: "boot-b"}
	if err := beat(a, at(0)); err != nil {
		t.Fatalf("the first instance's heartbeat: %v", err)
	}
	wantErr(t, "another machine's heartbeat while the first is live", st.UseHostInstance(f.ctx, f.host.ID, b, true, at(time.Second)), store.ErrHostTokenInUse)
	wantErr(t, "its claim", st.UseHostInstance(f.ctx, f.host.ID, b, false, at(2*time.Second)), store.ErrHostTokenInUse)
	if err := beat(a, at(2*time.Second)); err != nil {
		t.Fatalf("the live instance after the other's refusal: %v", err)
	}
	if err := st.UseHostInstance(f.ctx, f.host.ID, a, false, at(2*time.Second)); err != nil {
		t.Fatalf("the live instance's claim: %v", err)
	}
	s := server()
	if s.Instance == nil || s.Instance.ID != "inst-a" || s.Instance.BootID != "boot-a" || !s.Instance.LastSeen.Equal(at(2*time.Second)) {
		t.Fatalf("instance = %+v; want inst-a seen at +2s", s.Instance)
	}
	if s.Conflict == nil || s.Conflict.ID != "inst-b" || s.Conflict.BootID != "boot-b" || !s.Conflict.LastSeen.Equal(at(2*time.Second)) {
		t.Fatalf("conflict = %+v; want inst-b seen at +2s", s.Conflict)
	}
	// The bound is 3 intervals of 1 s: at exactly 3 s after the last
	// heartbeat the live one is still live; past it, it is not.
	wantErr(t, "at the offline bound", st.UseHostInstance(f.ctx, f.host.ID, b, true, at(5*time.Second)), store.ErrHostTokenInUse)
	if err := beat(b, at(5*time.Second+time.Millisecond)); err != nil {
		t.Fatalf("past the offline bound: %v", err)
	}
	if s := server(); s.Instance == nil || s.Instance.ID != "inst-b" || s.Conflict != nil {
		t.Fatalf("after the takeover: instance %+v, conflict %+v", s.Instance, s.Conflict)
	}
	wantErr(t, "the old instance come back", st.UseHostInstance(f.ctx, f.host.ID, a, true, at(6*time.Second)), store.ErrHostTokenInUse)

	// A stopping heartbeat releases the token at once.
	if err := beat(store.Instance{ID: b.ID, BootID: b.BootID, Stopping: true}, at(7*time.Second)); err != nil {
		t.Fatal(err)
	}
	if s := server(); s.Instance == nil || !s.Instance.Stopping {
		t.Fatalf("the stopping heartbeat: %+v", s.Instance)
	}
	c := store.Instance{ID: "inst-c", BootID: "boot-c"}
	if err := st.UseHostInstance(f.ctx, f.host.ID, c, false, at(7*time.Second+time.Millisecond)); err != nil {
		t.Fatalf("a claim right after the live one said it stops: %v", err)
	}
	wantErr(t, "the stopped one after the takeover", st.UseHostInstance(f.ctx, f.host.ID, b, true, at(8*time.Second)), store.ErrHostTokenInUse)

	// The same machine's restart (a handover, a crash) takes over at once,
	// the old instance live and silent about stopping.
	if err := beat(c, at(8*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := beat(store.Instance{ID: "inst-c2", BootID: "boot-c"}, at(8*time.Second+time.Millisecond)); err != nil {
		t.Fatalf("a restart on the same boot: %v", err)
	}
	// Without a boot id the same rule cannot apply: the bound decides.
	if err := beat(store.Instance{ID: "inst-d"}, at(20*time.Second)); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "a newcomer without a boot id", st.UseHostInstance(f.ctx, f.host.ID, store.Instance{ID: "inst-e"}, true, at(21*time.Second)), store.ErrHostTokenInUse)
	wantErr(t, "no instance id", st.UseHostInstance(f.ctx, f.host.ID, store.Instance{}, true, at(21*time.Second)), store.ErrInvalid)
	wantErr(t, "an unknown host", st.UseHostInstance(f.ctx, "host_nope", a, true, at(21*time.Second)), store.ErrNotFound)
}
