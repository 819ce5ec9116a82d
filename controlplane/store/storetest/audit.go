package storetest

import (
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// Operator is the audit of the conformance tests' admin actions.
var Operator = store.Audit{Actor: "test-operator"}

// Audit: every host action writes its row, with actor,
// time, target and reason, in the action's transaction; a refused action
// (an unknown host, no actor, a rotation with a bad grace) writes none and
// changes nothing; ListAudit filters by target, action and since, newest
// first, and pages by its Before cursor. ListServers shows who paused a
// paused host and why (the first pause's), nothing once it is resumed.
func testAudit(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	f.newHost("host-b")
	alice := store.Audit{Actor: "alice", Reason: "kernel upgrade"}

	if err := st.PauseHost(f.ctx, "host-a", true, alice, at(time.Second)); err != nil {
		t.Fatalf("PauseHost: %v", err)
	}
	if err := st.PauseHost(f.ctx, "host-a", true, store.Audit{Actor: "carol", Reason: "again"}, at(1500*time.Millisecond)); err != nil {
		t.Fatalf("PauseHost again: %v", err)
	}
	pausedBy := func() (string, string) {
		t.Helper()
		list, err := st.ListServers(f.ctx)
		if err != nil {
			t.Fatalf("ListServers: %v", err)
		}
		for _, sv := range list {
			if sv.Name == "host-a" {
				return sv.PausedBy, sv.PauseReason
			}
		}
		t.Fatalf("host-a not listed: %+v", list)
		return "", ""
	}
	if by, why := pausedBy(); by != "alice" || why != "kernel upgrade" {
		t.Fatalf("paused host-a shows %q %q, want the first pause's alice, kernel upgrade", by, why)
	}
	if err := st.PauseHost(f.ctx, "host-a", false, store.Audit{Actor: "bob"}, at(2*time.Second)); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if err := st.RotateHostToken(f.ctx, "host-b", store.HostRotation{TokenHash: Hash("b2")}, Operator, at(3*time.Second)); err != nil {
		t.Fatalf("RotateHostToken: %v", err)
	}
	if err := st.RemoveHost(f.ctx, "host-b", store.Audit{Actor: "alice", Reason: "decommissioned"}, at(4*time.Second)); err != nil {
		t.Fatalf("RemoveHost: %v", err)
	}

	// Refusals: nothing changes and no row is written.
	wantErr(t, "PauseHost(unknown)", st.PauseHost(f.ctx, "nobody", true, alice, at(5*time.Second)), store.ErrNotFound)
	wantErr(t, "RemoveHost(removed)", st.RemoveHost(f.ctx, "host-b", alice, at(5*time.Second)), store.ErrNotFound)
	wantErr(t, "PauseHost(no actor)", st.PauseHost(f.ctx, "host-a", true, store.Audit{Reason: "x"}, at(5*time.Second)), store.ErrInvalid)
	if h, err := st.HostByTokenHash(f.ctx, Hash("host-token-host-a")); err != nil || h.Paused {
		t.Fatalf("a pause without an actor paused the host: %+v, %v", h, err)
	}
	wantErr(t, "RotateHostToken(ended grace)",
		st.RotateHostToken(f.ctx, "host-a", store.HostRotation{Nonce: "n", GraceUntil: T0}, alice, at(5*time.Second)), store.ErrInvalid)

	if by, why := pausedBy(); by != "" || why != "" {
		t.Fatalf("resumed host-a shows %q %q", by, why)
	}

	all, err := st.ListAudit(f.ctx, store.AuditFilter{})
	if err != nil {
		t.Fatalf("ListAudit: %v", err)
	}
	want := []store.AuditEntry{
		{At: at(4 * time.Second), Actor: "alice", Action: wire.AuditHostRemove, Target: "host-b", Reason: "decommissioned"},
		{At: at(3 * time.Second), Actor: "test-operator", Action: wire.AuditHostRotateToken, Target: "host-b"},
		{At: at(2 * time.Second), Actor: "bob", Action: wire.AuditHostResume, Target: "host-a"},
		{At: at(1500 * time.Millisecond), Actor: "carol", Action: wire.AuditHostPause, Target: "host-a", Reason: "again"},
		{At: at(time.Second), Actor: "alice", Action: wire.AuditHostPause, Target: "host-a", Reason: "kernel upgrade"},
		{At: T0, Actor: "test-operator", Action: wire.AuditHostAdd, Target: "host-b"}, // the fixture's hosts
		{At: T0, Actor: "test-operator", Action: wire.AuditHostAdd, Target: "host-a"},
	}
	if len(all) != len(want) {
		t.Fatalf("audit = %+v, want %d rows", all, len(want))
	}
	for i, e := range all {
		w := want[i]
		w.ID = e.ID
		if e != w {
			t.Errorf("audit[%d] = %+v, want %+v", i, e, w)
		}
		if i > 0 && e.ID >= all[i-1].ID {
			t.Errorf("audit ids not newest first: %d after %d", e.ID, all[i-1].ID)
		}
	}

	check := func(what string, f store.AuditFilter, wantIdx ...int) {
		t.Helper()
		got, err := st.ListAudit(t.Context(), f)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if len(got) != len(wantIdx) {
			t.Fatalf("%s = %+v, want rows %v", what, got, wantIdx)
		}
		for i, k := range wantIdx {
			if got[i].ID != all[k].ID {
				t.Errorf("%s[%d] = %+v, want %+v", what, i, got[i], all[k])
			}
		}
	}
	check("target host-a", store.AuditFilter{Target: "host-a"}, 2, 3, 4, 6)
	check("action remove", store.AuditFilter{Action: wire.AuditHostRemove}, 0)
	check("action pause", store.AuditFilter{Action: wire.AuditHostPause}, 3, 4)
	check("since 2s", store.AuditFilter{Since: at(2 * time.Second)}, 0, 1, 2)
	check("page 1", store.AuditFilter{Limit: 3}, 0, 1, 2)
	check("page 2", store.AuditFilter{Limit: 3, Before: all[2].ID}, 3, 4, 5)
	check("target and action", store.AuditFilter{Target: "host-b", Action: wire.AuditHostPause})
}

// Lost is the audit of the conformance tests' mark-lost: it needs a reason.
var Lost = store.Audit{Actor: "test-operator", Reason: "the host is gone for good"}
