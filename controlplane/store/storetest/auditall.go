package storetest

import (
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// AuditEveryAction: a host added by hand, a registration (its actor the
// registration token's name and id), a conversation marked LOST, and the
// creation and revocation of user and registration tokens each write
// their row (actor, time, target, reason) in the action's transaction. A
// refused one writes none and does nothing: mark-lost without a reason,
// any action without an actor, a registration past its token's uses; a
// second revocation or a second mark-lost does nothing and writes none.
func testAuditEveryAction(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	alice := store.Audit{Actor: "cli:alice", Reason: "rack 4"}
	bob := store.Audit{Actor: "bob"}
	var want []store.AuditEntry // oldest first
	row := func(d time.Duration, a store.Audit, action, target string) {
		want = append(want, store.AuditEntry{At: at(d), Actor: a.Actor, Action: action, Target: target, Reason: a.Reason})
	}

	if _, err := st.CreateHost(f.ctx, "host-x", Hash("x"), alice, at(time.Second)); err != nil {
		t.Fatalf("CreateHost: %v", err)
	}
	row(time.Second, alice, wire.AuditHostAdd, "host-x")
	ut, err := st.CreateUserToken(f.ctx, "ci", Hash("rdu_ci"), bob, at(2*time.Second))
	if err != nil {
		t.Fatalf("CreateUserToken: %v", err)
	}
	row(2*time.Second, bob, wire.AuditUserTokenCreate, ut.ID)
	if _, err := st.RevokeUserToken(f.ctx, ut.ID, alice, at(3*time.Second)); err != nil {
		t.Fatalf("RevokeUserToken: %v", err)
	}
	row(3*time.Second, alice, wire.AuditUserTokenRevoke, ut.ID)
	if _, err := st.RevokeUserToken(f.ctx, ut.ID, bob, at(4*time.Second)); err != nil {
		t.Fatalf("RevokeUserToken again: %v", err)
	}
	rt, err := st.CreateRegistrationToken(f.ctx, store.RegistrationToken{Name: "fleet", MaxUses: 1}, Hash("reg"), bob, at(5*time.Second))
	if err != nil {
		t.Fatalf("CreateRegistrationToken: %v", err)
	}
	row(5*time.Second, bob, wire.AuditRegistrationTokenCreate, rt.ID)
	if _, err := st.RegisterHost(f.ctx, Hash("reg"), "auto-1", nil, Hash("auto-1"), at(6*time.Second)); err != nil {
		t.Fatalf("RegisterHost: %v", err)
	}
	row(6*time.Second, store.Audit{Actor: "registration:fleet/" + rt.ID}, wire.AuditHostRegister, "auto-1")
	_, err = st.RegisterHost(f.ctx, Hash("reg"), "auto-2", nil, Hash("auto-2"), at(6*time.Second))
	wantErr(t, "RegisterHost(used up)", err, store.ErrRegistrationUsedUp)
	if _, err := st.RevokeRegistrationToken(f.ctx, rt.ID, alice, at(7*time.Second)); err != nil {
		t.Fatalf("RevokeRegistrationToken: %v", err)
	}
	row(7*time.Second, alice, wire.AuditRegistrationTokenRevoke, rt.ID)
	if _, err := st.RevokeRegistrationToken(f.ctx, rt.ID, bob, at(8*time.Second)); err != nil {
		t.Fatalf("RevokeRegistrationToken again: %v", err)
	}

	conv := f.conversation()
	_, err = st.LoseConversation(f.ctx, conv.ID, store.Audit{Actor: "bob", Reason: "  "}, at(9*time.Second))
	wantErr(t, "LoseConversation(no reason)", err, store.ErrInvalid)
	if c := f.conv(conv.ID); c.State == wire.ConversationLost {
		t.Fatalf("a mark-lost without a reason marked it: %+v", c)
	}
	gone := store.Audit{Actor: "alice", Reason: "host-a's disk died"}
	if c, err := st.LoseConversation(f.ctx, conv.ID, gone, at(10*time.Second)); err != nil || c.State != wire.ConversationLost {
		t.Fatalf("LoseConversation = %+v, %v", c, err)
	}
	row(10*time.Second, gone, wire.AuditConversationLose, conv.ID)
	if _, err := st.LoseConversation(f.ctx, conv.ID, Lost, at(11*time.Second)); err != nil {
		t.Fatalf("LoseConversation again: %v", err)
	}

	// No actor: refused, nothing done.
	noActor := store.Audit{Reason: "x"}
	_, err = st.CreateHost(f.ctx, "host-y", Hash("y"), noActor, at(12*time.Second))
	wantErr(t, "CreateHost(no actor)", err, store.ErrInvalid)
	if _, err := st.HostByTokenHash(f.ctx, Hash("y")); err == nil {
		t.Fatal("a host added without an actor exists")
	}
	_, err = st.CreateUserToken(f.ctx, "anon", Hash("rdu_anon"), noActor, at(12*time.Second))
	wantErr(t, "CreateUserToken(no actor)", err, store.ErrInvalid)
	if _, err := st.UserTokenByHash(f.ctx, Hash("rdu_anon")); err == nil {
		t.Fatal("a user token created without an actor exists")
	}
	_, err = st.CreateRegistrationToken(f.ctx, store.RegistrationToken{Name: "anon"}, Hash("reg-anon"), noActor, at(12*time.Second))
	wantErr(t, "CreateRegistrationToken(no actor)", err, store.ErrInvalid)
	if list, err := st.ListRegistrationTokens(f.ctx); err != nil || len(list) != 1 {
		t.Fatalf("registration tokens after a refused create: %+v, %v", list, err)
	}
	conv2 := f.conversation()
	_, err = st.LoseConversation(f.ctx, conv2.ID, noActor, at(12*time.Second))
	wantErr(t, "LoseConversation(no actor)", err, store.ErrInvalid)
	if c := f.conv(conv2.ID); c.State == wire.ConversationLost {
		t.Fatalf("a mark-lost without an actor marked it: %+v", c)
	}

	got, err := st.ListAudit(f.ctx, store.AuditFilter{Since: at(time.Second)})
	if err != nil {
		t.Fatalf("ListAudit: %v", err)
	}
	if len(got) != len(want) {
		t.Fatalf("audit = %+v, want %d rows", got, len(want))
	}
	for i, e := range got {
		w := want[len(want)-1-i]
		w.ID = e.ID
		if e != w {
			t.Errorf("audit[%d] = %+v, want %+v", i, e, w)
		}
	}
	for _, e := range got {
		if strings.Contains(e.Actor+e.Target+e.Reason, "rdu_") {
			t.Errorf("a token in the audit: %+v", e)
		}
	}
	if lost, err := st.ListAudit(f.ctx, store.AuditFilter{Target: conv.ID}); err != nil || len(lost) != 1 || lost[0].Action != wire.AuditConversationLose {
		t.Fatalf("the conversation's audit = %+v, %v", lost, err)
	}
}
