package controlplane_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/wire"
)

// Issue 22 §1 over HTTP: the instance headers decide host_token_in_use on
// heartbeats and claims; a daemon that sends none (older than them) is
// not checked and changes nothing; an oversized header is 400; the host
// JSON drops a conflict once it was last refused longer ago than the
// offline bound; every refusal is recorded, without the token.
func TestHostTokenInUseOverHTTP(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	client := func(instance, boot string) *wire.Client {
		h := http.Header{}
		h.Set(wire.HeaderInstanceID, instance)
		h.Set(wire.HeaderBootID, boot)
		return &wire.Client{BaseURL: f.url, Header: h}
	}
	a, b := client("inst-a", "boot-a"), client("inst-b", "boot-b")
	hb := wire.HostHeartbeat{Capacity: 1, IntervalMS: 1000}
	if _, err := a.HostHeartbeat(ctx, f.hostToken, hb); err != nil {
		t.Fatal(err)
	}
	inUse := func(what string, err error) {
		t.Helper()
		var se *wire.StatusError
		if !errors.As(err, &se) || se.Status != http.StatusConflict || se.Code != wire.CodeHostTokenInUse {
			t.Fatalf("%s: %v; want 409 %s", what, err, wire.CodeHostTokenInUse)
		}
	}
	_, err := b.HostHeartbeat(ctx, f.hostToken, hb)
	inUse("the other instance's heartbeat", err)
	_, err = b.Claim(ctx, f.hostToken, wire.ClaimRequest{})
	inUse("the other instance's claim", err)
	if _, err := a.Claim(ctx, f.hostToken, wire.ClaimRequest{}); !errors.Is(err, wire.ErrNoClaim) {
		t.Fatalf("the live instance's claim: %v", err)
	}
	if _, err := f.wc.HostHeartbeat(ctx, f.hostToken, hb); err != nil {
		t.Fatalf("a daemon sending no instance: %v", err)
	}
	long := client(strings.Repeat("x", 65), "")
	if _, err := long.HostHeartbeat(ctx, f.hostToken, hb); diagnostics.Status(err) != http.StatusBadRequest {
		t.Fatalf("an instance id of 65 bytes: %v, want 400", err)
	}
	var list wire.ServerList
	f.user(http.MethodGet, "/v1/admin/servers", nil, &list)
	s := list.Servers[0]
	if s.Instance == nil || s.Instance.ID != "inst-a" || s.Conflict == nil || s.Conflict.ID != "inst-b" {
		t.Fatalf("host JSON: instance %+v, conflict %+v", s.Instance, s.Conflict)
	}
	f.clock.Advance(2 * time.Second)
	if _, err := a.HostHeartbeat(ctx, f.hostToken, hb); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(2 * time.Second) // b was last refused 4 s ago, past the 3 s bound
	list = wire.ServerList{}
	f.user(http.MethodGet, "/v1/admin/servers", nil, &list)
	if s := list.Servers[0]; s.Conflict != nil || s.Instance == nil || s.Instance.ID != "inst-a" {
		t.Fatalf("host JSON after the bound: instance %+v, conflict %+v", s.Instance, s.Conflict)
	}
	if n := strings.Count(f.logs.String(), controlplane.MsgHostTokenInUse); n != 2 {
		t.Fatalf("%d %s records, want 2", n, controlplane.MsgHostTokenInUse)
	}
	if strings.Contains(f.logs.String(), f.hostToken) {
		t.Fatal("a record holds the host token")
	}
}
