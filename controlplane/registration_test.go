package controlplane_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// POST /v1/agent/register on each database: a registration token buys a
// daemon its own host token, which then heartbeats and claims; every bad
// input is its own clear refusal and registers nothing (the refused
// registrations' names stay free, the token's uses uncounted); revoking
// the registration token leaves the registered host working; no token is
// ever in a record.
func TestRegisterOverHTTP(t *testing.T) {
	onEachDatabase(t, func(t *testing.T, db database) {
		f := newFixtureOn(t, db)
		ctx := context.Background()
		mk := func(name string, rt store.RegistrationToken) (string, store.RegistrationToken) {
			t.Helper()
			tok := controlplane.NewToken(controlplane.RegistrationTokenPrefix)
			rt.Name = name
			got, err := f.st.CreateRegistrationToken(ctx, rt, controlplane.HashToken(tok), store.Audit{Actor: "test"}, f.clock.Now())
			if err != nil {
				t.Fatal(err)
			}
			return tok, got
		}
		exp := f.clock.Now().Add(time.Hour)
		fleet, fleetRow := mk("fleet", store.RegistrationToken{Labels: wire.Labels{"pool": "a"}, MaxUses: 2, ExpiresAt: &exp})
		once, _ := mk("once", store.RegistrationToken{MaxUses: 1})
		soon := f.clock.Now().Add(time.Minute)
		expiring, _ := mk("expiring", store.RegistrationToken{ExpiresAt: &soon})

		reg := func(token, body string) (int, wire.ErrorBody, wire.RegisterResponse) {
			t.Helper()
			code, b := f.do(http.MethodPost, wire.PathRegister, token, body)
			var e wire.ErrorBody
			var ok wire.RegisterResponse
			if code == http.StatusOK {
				if err := json.Unmarshal(b, &ok); err != nil {
					t.Fatalf("register answer %s: %v", b, err)
				}
			} else if err := json.Unmarshal(b, &e); err != nil || e.Message == "" {
				t.Fatalf("register refusal %d %s: no error body (%v)", code, b, err)
			}
			return code, e, ok
		}

		code, _, r1 := reg(fleet, `{"name":"r1","labels":{"pool":"a"},"version":"1.2.3"}`)
		if code != http.StatusOK || r1.Name != "r1" || !strings.HasPrefix(r1.HostToken, controlplane.HostTokenPrefix) {
			t.Fatalf("register = %d %+v", code, r1)
		}
		// The registration is audited, its actor the registration token's
		// name and id, never a token.
		var audit wire.AuditList
		f.user(http.MethodGet, controlplane.PathAdminAudit+"?action="+wire.AuditHostRegister, nil, &audit)
		if len(audit.Entries) != 1 || audit.Entries[0].Target != "r1" || audit.Entries[0].Actor != "registration:fleet/"+fleetRow.ID ||
			strings.Contains(audit.Entries[0].Actor, fleet) {
			t.Fatalf("the registration's audit = %+v, want one row: r1 by registration:fleet/%s", audit.Entries, fleetRow.ID)
		}
		if _, err := f.wc.HostHeartbeat(ctx, r1.HostToken, wire.HostHeartbeat{Capacity: 1, Labels: wire.Labels{"pool": "a"}}); err != nil {
			t.Fatalf("the registered host's heartbeat: %v", err)
		}
		if _, err := f.wc.HostHeartbeat(ctx, fleet, wire.HostHeartbeat{Capacity: 1}); wireStatus(err) != http.StatusUnauthorized {
			t.Fatalf("a registration token used as a host token: %v", err)
		}
		if code, _, _ := reg(once, `{"name":"o1"}`); code != http.StatusOK {
			t.Fatalf("the one use of a max-uses-1 token: %d", code)
		}

		f.clock.Advance(2 * time.Minute) // past the expiring token's end
		for _, tc := range []struct {
			what, token, body string
			status            int
			code              string
		}{
			{"no token", "", `{"name":"x1"}`, http.StatusUnauthorized, wire.CodeUnauthorized},
			{"an unknown token", "rdr_nobody", `{"name":"x2"}`, http.StatusUnauthorized, wire.CodeUnauthorized},
			{"an expired token", expiring, `{"name":"x3"}`, http.StatusUnauthorized, wire.CodeRegistrationExpired},
			{"a token past its max uses", once, `{"name":"x4"}`, http.StatusUnauthorized, wire.CodeRegistrationUsedUp},
			{"a label not granted", fleet, `{"name":"x5","labels":{"pool":"b"}}`, http.StatusForbidden, wire.CodeForbidden},
			{"an automatic label", fleet, `{"name":"x6","labels":{"os":"plan9"}}`, http.StatusBadRequest, wire.CodeInvalid},
			{"a taken name", fleet, `{"name":"host-a"}`, http.StatusConflict, wire.CodeHostExists},
			{"a bad name", fleet, `{"name":"a b"}`, http.StatusBadRequest, wire.CodeInvalid},
			{"no name", fleet, `{}`, http.StatusBadRequest, wire.CodeInvalid},
			{"an unknown field", fleet, `{"name":"x7","token":"t"}`, http.StatusBadRequest, wire.CodeUnknownField},
		} {
			code, e, _ := reg(tc.token, tc.body)
			if code != tc.status || e.Code != tc.code {
				t.Errorf("register with %s = %d %+v; want %d %s", tc.what, code, e, tc.status, tc.code)
			}
		}
		if code, e, _ := reg(fleet, `{"name":"x5","labels":{"pool":"b"}}`); !strings.Contains(e.Message, "pool=b") {
			t.Errorf("a refused label is not named: %d %+v", code, e)
		}
		servers, err := f.st.ListServers(ctx)
		if err != nil || len(servers) != 3 {
			t.Fatalf("hosts after refused registrations = %+v, %v; want host-a, o1, r1", servers, err)
		}
		list, _ := f.st.ListRegistrationTokens(ctx)
		for _, rt := range list {
			if rt.ID == fleetRow.ID && rt.Uses != 1 {
				t.Fatalf("fleet token uses after refusals = %d, want 1", rt.Uses)
			}
		}

		if _, err := f.st.RevokeRegistrationToken(ctx, fleetRow.ID, store.Audit{Actor: "test"}, f.clock.Now()); err != nil {
			t.Fatal(err)
		}
		if code, e, _ := reg(fleet, `{"name":"r2"}`); code != http.StatusUnauthorized {
			t.Fatalf("a revoked registration token = %d %+v", code, e)
		}
		if _, err := f.wc.HostHeartbeat(ctx, r1.HostToken, wire.HostHeartbeat{Capacity: 1}); err != nil {
			t.Fatalf("a host registered by a since-revoked token: %v", err)
		}
		for _, secret := range []string{fleet, once, expiring, r1.HostToken} {
			if strings.Contains(f.logs.String(), secret) {
				t.Fatalf("a token is in the records:\n%s", f.logs.String())
			}
		}
		if !strings.Contains(f.logs.String(), controlplane.MsgHostRegistered) {
			t.Fatalf("no %s record:\n%s", controlplane.MsgHostRegistered, f.logs.String())
		}
	})
}

// A rotation with a grace, on the store's clock in a synctest bubble: the
// old token keeps working for the grace; a heartbeat with it answers the
// new token (again, the same, if the first answer was lost), which works
// at once; the first moment of the grace's end the old token is refused
// for every host-scoped call, the new one goes on. Nobody but the host
// sees the new token: the admin answer does not hold it.
func TestRotationGraceEndsOnTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubble(t)
		ctx := context.Background()
		const grace = 10 * time.Minute
		ms := grace.Milliseconds()
		var tr wire.HostTokenResponse
		if _, err := b.wc.Do(ctx, http.MethodPost, "/v1/admin/hosts/host-a/rotate-token", b.userToken, wire.RotateTokenRequest{GraceMS: &ms}, &tr); err != nil {
			t.Fatalf("rotate-token: %v", err)
		}
		if tr.Token != "" || tr.GraceUntil == nil || !tr.GraceUntil.Equal(time.Now().Add(grace)) {
			t.Fatalf("rotate-token with a grace answered %+v; want no token and the grace's end", tr)
		}
		old := b.hostToken
		first, err := b.wc.HostHeartbeat(ctx, old, wire.HostHeartbeat{Capacity: 1})
		if err != nil || !strings.HasPrefix(first.HostToken, controlplane.HostTokenPrefix) || first.HostToken == old {
			t.Fatalf("heartbeat with the previous token = %+v, %v; want the new token", first, err)
		}
		again, err := b.wc.HostHeartbeat(ctx, old, wire.HostHeartbeat{Capacity: 1})
		if err != nil || again.HostToken != first.HostToken {
			t.Fatalf("a second heartbeat with the previous token = %+v, %v; want the same new token", again, err)
		}
		next := first.HostToken
		if resp, err := b.wc.HostHeartbeat(ctx, next, wire.HostHeartbeat{Capacity: 1}); err != nil || resp.HostToken != "" {
			t.Fatalf("heartbeat with the new token = %+v, %v", resp, err)
		}
		time.Sleep(grace - time.Millisecond)
		if _, err := b.wc.Claim(ctx, old, wire.ClaimRequest{}); err != nil && !errorsIsNoClaim(err) {
			t.Fatalf("the previous token just before the grace's end: %v", err)
		}
		time.Sleep(time.Millisecond)
		if _, err := b.wc.HostHeartbeat(ctx, old, wire.HostHeartbeat{}); wireStatus(err) != http.StatusUnauthorized {
			t.Fatalf("the previous token at the grace's end (heartbeat): %v", err)
		}
		if _, err := b.wc.Claim(ctx, old, wire.ClaimRequest{}); wireStatus(err) != http.StatusUnauthorized {
			t.Fatalf("the previous token at the grace's end (claim): %v", err)
		}
		if _, err := b.wc.HostHeartbeat(ctx, next, wire.HostHeartbeat{Capacity: 1}); err != nil {
			t.Fatalf("the new token after the grace: %v", err)
		}

		// A bad grace is refused; grace 0 shows the token and ends the old at once.
		bad := int64(-1)
		if _, err := b.wc.Do(ctx, http.MethodPost, "/v1/admin/hosts/host-a/rotate-token", b.userToken, wire.RotateTokenRequest{GraceMS: &bad}, nil); wireStatus(err) != http.StatusBadRequest {
			t.Fatalf("a negative grace: %v", err)
		}
		zero, tr := int64(0), wire.HostTokenResponse{}
		if _, err := b.wc.Do(ctx, http.MethodPost, "/v1/admin/hosts/host-a/rotate-token", b.userToken, wire.RotateTokenRequest{GraceMS: &zero}, &tr); err != nil || tr.Token == "" || tr.GraceUntil != nil {
			t.Fatalf("rotate-token with grace 0 = %+v, %v", tr, err)
		}
		if _, err := b.wc.HostHeartbeat(ctx, next, wire.HostHeartbeat{}); wireStatus(err) != http.StatusUnauthorized {
			t.Fatalf("the token replaced without a grace: %v", err)
		}
	})
}

func wireStatus(err error) int {
	status, _ := statusOf(err)
	return status
}

func errorsIsNoClaim(err error) bool { return errors.Is(err, wire.ErrNoClaim) }
