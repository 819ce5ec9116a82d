package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// Registration: a registration token registers hosts with
// their own tokens and the labels it grants, counts its uses, and its
// revocation leaves the hosts it registered as they were.
func testRegistration(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	exp := at(time.Hour)
	rt, err := st.CreateRegistrationToken(f.ctx, store.RegistrationToken{Name: "fleet", Labels: wire.Labels{"pool": "a", "gpu": "1"}, MaxUses: 2, ExpiresAt: &exp}, Hash("reg"), Operator, T0)
	if err != nil {
		t.Fatalf("CreateRegistrationToken: %v", err)
	}
	h, err := st.RegisterHost(f.ctx, Hash("reg"), "r1", wire.Labels{"pool": "a"}, Hash("host-r1"), at(time.Second))
	if err != nil {
		t.Fatalf("RegisterHost: %v", err)
	}
	if got, err := st.HostByTokenHash(f.ctx, Hash("host-r1")); err != nil || got.ID != h.ID || got.Previous != nil {
		t.Fatalf("the registered host's token = %+v, %v; want %+v", got, err, h)
	}
	if _, err := st.RegisterHost(f.ctx, Hash("reg"), "r2", nil, Hash("host-r2"), at(2*time.Second)); err != nil {
		t.Fatalf("RegisterHost without labels: %v", err)
	}
	servers, err := st.ListServers(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]wire.Server{}
	for _, s := range servers {
		byName[s.Name] = s
	}
	if byName["r1"].Labels["pool"] != "a" || len(byName["r2"].Labels) != 0 {
		t.Fatalf("registered hosts' labels = %+v", servers)
	}
	if _, err := st.RevokeRegistrationToken(f.ctx, rt.ID, Operator, at(3*time.Second)); err != nil {
		t.Fatalf("RevokeRegistrationToken: %v", err)
	}
	if _, err := st.HostByTokenHash(f.ctx, Hash("host-r1")); err != nil {
		t.Fatalf("a host registered by a revoked registration token was refused: %v", err)
	}
	list, err := st.ListRegistrationTokens(f.ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("ListRegistrationTokens = %+v, %v", list, err)
	}
	got := list[0]
	if got.ID != rt.ID || got.Uses != 2 || got.MaxUses != 2 || got.RevokedAt == nil || !got.RevokedAt.Equal(at(3*time.Second)) ||
		got.ExpiresAt == nil || !got.ExpiresAt.Equal(exp) || got.Labels.String() != "gpu=1,pool=a" {
		t.Fatalf("listed registration token = %+v", got)
	}
	again, err := st.RevokeRegistrationToken(f.ctx, rt.ID, Operator, at(4*time.Second))
	if err != nil || !again.RevokedAt.Equal(at(3*time.Second)) {
		t.Fatalf("revoking again = %+v, %v; want the first time kept", again, err)
	}
	_, err = st.RevokeRegistrationToken(f.ctx, "rtok_nobody", Operator, at(4*time.Second))
	wantErr(t, "RevokeRegistrationToken(unknown)", err, store.ErrNotFound)
}

// Every refused registration is its own error and leaves no host, no
// label and no counted use behind.
func testRegistrationRefusals(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	exp := at(time.Minute)
	mk := func(name string, tok store.RegistrationToken) store.RegistrationToken {
		t.Helper()
		tok.Name = name
		rt, err := st.CreateRegistrationToken(f.ctx, tok, Hash(name), Operator, T0)
		if err != nil {
			t.Fatalf("CreateRegistrationToken(%s): %v", name, err)
		}
		return rt
	}
	mk("expiring", store.RegistrationToken{ExpiresAt: &exp})
	mk("once", store.RegistrationToken{MaxUses: 1})
	mk("pool-a", store.RegistrationToken{Labels: wire.Labels{"pool": "a"}})
	revoked := mk("revoked", store.RegistrationToken{})
	if _, err := st.RevokeRegistrationToken(f.ctx, revoked.ID, Operator, T0); err != nil {
		t.Fatal(err)
	}
	if _, err := st.RegisterHost(f.ctx, Hash("once"), "first", nil, Hash("h-first"), at(time.Second)); err != nil {
		t.Fatalf("the one use: %v", err)
	}
	before, _ := st.ListServers(f.ctx)

	for _, tc := range []struct {
		what, reg, name string
		labels          wire.Labels
		want            error
	}{
		{"an expired token", "expiring", "x1", nil, store.ErrRegistrationExpired},
		{"a token past its max uses", "once", "x2", nil, store.ErrRegistrationUsedUp},
		{"a label the token does not grant", "pool-a", "x3", wire.Labels{"pool": "b"}, store.ErrLabelNotGranted},
		{"a revoked token", "revoked", "x4", nil, store.ErrUnauthorized},
		{"an unknown token", "nobody", "x5", nil, store.ErrUnauthorized},
		{"a taken name", "pool-a", "host-a", nil, store.ErrExists},
		{"a name taken by a registered host", "pool-a", "first", nil, store.ErrExists},
	} {
		_, err := st.RegisterHost(f.ctx, Hash(tc.reg), tc.name, tc.labels, Hash("refused-"+tc.name), exp)
		wantErr(t, "RegisterHost with "+tc.what, err, tc.want)
		_, err = st.HostByTokenHash(f.ctx, Hash("refused-"+tc.name))
		wantErr(t, "the host token of a refused registration ("+tc.what+")", err, store.ErrUnauthorized)
	}
	after, _ := st.ListServers(f.ctx)
	if len(after) != len(before) {
		t.Fatalf("refused registrations left hosts: before %+v, after %+v", before, after)
	}
	list, _ := st.ListRegistrationTokens(f.ctx)
	for _, rt := range list {
		want := 0
		if rt.Name == "once" {
			want = 1
		}
		if rt.Uses != want {
			t.Fatalf("registration token %s counts %d uses after refusals; want %d", rt.Name, rt.Uses, want)
		}
	}
	_, err := st.CreateRegistrationToken(f.ctx, store.RegistrationToken{Name: "neg", MaxUses: -1}, Hash("neg"), Operator, T0)
	wantErr(t, "CreateRegistrationToken with negative max uses", err, store.ErrInvalid)
	_, err = st.CreateRegistrationToken(f.ctx, store.RegistrationToken{Name: "dup"}, Hash("once"), Operator, T0)
	wantErr(t, "CreateRegistrationToken of a token stored already", err, store.ErrExists)
}

// Many registrations race for a token's last uses: exactly max_uses of
// them register (on PostgreSQL the token's row is locked).
func testRaceRegistrationLastUse(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	const maxUses, racers = 3, 8
	if _, err := st.CreateRegistrationToken(f.ctx, store.RegistrationToken{Name: "few", MaxUses: maxUses}, Hash("few"), Operator, T0); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, racers)
	for i := range racers {
		wg.Go(func() {
			name := fmt.Sprintf("racer-%d", i)
			_, errs[i] = st.RegisterHost(f.ctx, Hash("few"), name, nil, Hash("h-"+name), at(time.Second))
		})
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case !errors.Is(err, store.ErrRegistrationUsedUp):
			t.Fatalf("a racing registration failed otherwise: %v", err)
		}
	}
	list, _ := st.ListRegistrationTokens(f.ctx)
	if ok != maxUses || list[0].Uses != maxUses {
		t.Fatalf("%d registrations of %d succeeded, %d uses counted; want %d", ok, racers, list[0].Uses, maxUses)
	}
}

// A rotation with a grace keeps the current token as the previous one
// (with the grace's end and the nonce), refuses nothing until the host
// adopts its new token, and a second rotation before the host adopted
// the first keeps the token the host holds. A rotation without a grace
// replaces the token and ends any grace.
func testRotationGrace(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	until := at(10 * time.Minute)
	if err := st.RotateHostToken(f.ctx, "host-a", store.HostRotation{Nonce: "n1", GraceUntil: until}, Operator, T0); err != nil {
		t.Fatalf("RotateHostToken with a grace: %v", err)
	}
	h, err := st.HostByTokenHash(f.ctx, Hash("host-token-host-a"))
	if err != nil || h.ID != f.host.ID || h.Previous == nil || h.Previous.Nonce != "n1" || !h.Previous.Until.Equal(until) {
		t.Fatalf("the previous token in its grace = %+v, %v", h, err)
	}
	until2 := at(20 * time.Minute)
	if err := st.RotateHostToken(f.ctx, "host-a", store.HostRotation{Nonce: "n2", GraceUntil: until2}, Operator, at(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if h, err := st.HostByTokenHash(f.ctx, Hash("host-token-host-a")); err != nil || h.Previous == nil || h.Previous.Nonce != "n2" {
		t.Fatalf("a second rotation before adoption lost the token the host holds: %+v, %v", h, err)
	}
	if err := st.AdoptRotatedToken(f.ctx, f.host.ID, Hash("host-token-host-a"), Hash("derived")); err != nil {
		t.Fatalf("AdoptRotatedToken: %v", err)
	}
	if err := st.AdoptRotatedToken(f.ctx, f.host.ID, Hash("host-token-host-a"), Hash("derived")); err != nil {
		t.Fatalf("AdoptRotatedToken again: %v", err)
	}
	if h, err := st.HostByTokenHash(f.ctx, Hash("derived")); err != nil || h.ID != f.host.ID || h.Previous != nil {
		t.Fatalf("the adopted token = %+v, %v", h, err)
	}
	if h, err := st.HostByTokenHash(f.ctx, Hash("host-token-host-a")); err != nil || h.Previous == nil {
		t.Fatalf("the previous token after adoption, in its grace = %+v, %v", h, err)
	}
	wantErr(t, "AdoptRotatedToken with a token that is not the previous one",
		st.AdoptRotatedToken(f.ctx, f.host.ID, Hash("derived"), Hash("other")), store.ErrNotFound)
	wantErr(t, "RotateHostToken with a grace that ended",
		st.RotateHostToken(f.ctx, "host-a", store.HostRotation{Nonce: "n3", GraceUntil: T0}, Operator, at(time.Minute)), store.ErrInvalid)

	if err := st.RotateHostToken(f.ctx, "host-a", store.HostRotation{TokenHash: Hash("now")}, Operator, at(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	for _, old := range []string{"host-token-host-a", "derived"} {
		_, err := st.HostByTokenHash(f.ctx, Hash(old))
		wantErr(t, "token "+old+" after a rotation without a grace", err, store.ErrUnauthorized)
	}
	if h, err := st.HostByTokenHash(f.ctx, Hash("now")); err != nil || h.Previous != nil {
		t.Fatalf("the token of a rotation without a grace = %+v, %v", h, err)
	}
}
