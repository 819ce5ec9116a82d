package runner

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/wire"
)

// Issue 22 §1 with the real control plane, real daemons and a real turn
// child: two daemons with one host token on two machines (boot ids). The
// second is refused 409 host_token_in_use on its heartbeats and claims,
// says so once, claims nothing and keeps running; the first is
// unaffected (its turn renews on the same attempt, no refusal); Admin →
// Servers (JSON and page) shows both instances as a conflict. When the
// first stops, its last heartbeat releases the token and the second
// takes over and claims. A handover restart of that daemon (Run's context
// ends: no stopping heartbeat) on the same machine is not refused, while
// a third machine's daemon still is.
func TestHostTokenInUse(t *testing.T) {
	c := newCP(t)
	ctx := context.Background()
	userTok := controlplane.NewToken(controlplane.UserTokenPrefix)
	if _, err := c.st.CreateUserToken(ctx, "ops", controlplane.HashToken(userTok), store.Audit{Actor: "test"}, c.now()); err != nil {
		t.Fatal(err)
	}
	servers := func() wire.Server {
		t.Helper()
		var list wire.ServerList
		if _, err := c.wc.Do(ctx, http.MethodGet, "/v1/admin/servers", userTok, nil, &list); err != nil || len(list.Servers) != 1 {
			t.Fatalf("servers: %+v, %v", list, err)
		}
		return list.Servers[0]
	}
	// Heartbeats every second: the offline bound (3 s) outlasts a loaded
	// machine's delays, so that only a stop releases the token here.
	machine := func(boot string, more ...func(*Config)) func(*Config) {
		return func(cfg *Config) {
			cfg.BootID, cfg.HostHeartbeatInterval = boot, time.Second
			for _, m := range more {
				m(cfg)
			}
		}
	}
	j1 := c.enqueue("hang")
	a := startDaemon(t, c, machine("boot-a"))
	waitAccepted(t, a)
	b := startDaemon(t, c, machine("boot-b"))
	defer func() {
		if t.Failed() {
			t.Logf("a's records:\n%s\nb's records:\n%s", a.logs, b.logs)
		}
	}()
	waitFor(t, "b refused", 10*time.Second, func() bool { return b.logs.has(diagnostics.MsgHostTokenInUse) })
	j2 := c.enqueue("hang")
	first := servers()
	if first.Instance == nil || first.Instance.BootID != "boot-a" || first.Conflict == nil || first.Conflict.BootID != "boot-b" {
		t.Fatalf("servers: instance %+v, conflict %+v; want a's live and b's refused", first.Instance, first.Conflict)
	}
	// b goes on being refused (its heartbeats come and are refused) while
	// a goes on renewing its turn; b claims nothing meanwhile.
	renewed := c.job(j1.ID).Attempts[0].LeaseExpiresAt
	waitFor(t, "b refused again and a's lease renewed", 10*time.Second, func() bool {
		s := servers()
		return s.Conflict != nil && s.Conflict.LastSeen.After(first.Conflict.LastSeen) && c.job(j1.ID).Attempts[0].LeaseExpiresAt.After(renewed)
	})
	if got := c.job(j2.ID); got.State != wire.JobQueued || len(got.Attempts) != 0 {
		t.Fatalf("the refused daemon claimed: job %s, %d attempts", got.State, len(got.Attempts))
	}
	if got := c.job(j1.ID); got.State != wire.JobRunning || len(got.Attempts) != 1 {
		t.Fatalf("a's turn: %s, %d attempts", got.State, len(got.Attempts))
	}
	if a.logs.has(diagnostics.MsgHostTokenInUse) || a.logs.has(MsgHostTokenRefused) || b.logs.has(MsgHostTokenRefused) {
		t.Fatal("a was refused, or a refusal was taken for a bad token")
	}
	if st := b.d.status(time.Now()); st.paused != pauseHostTokenInUse || !strings.Contains(st.String(), "host token in use") {
		t.Fatalf("b's status %+v %q", st, st)
	}
	if n := b.logs.count(diagnostics.MsgHostTokenInUse); n != 1 {
		t.Fatalf("%d %s records; want one until it clears", n, diagnostics.MsgHostTokenInUse)
	}
	page := adminPageText(t, c, userTok)
	for _, want := range []string{"conflict: two daemons present this host", first.Instance.ID, first.Conflict.ID, "boot-a", "boot-b"} {
		if !strings.Contains(page, want) {
			t.Fatalf("Admin → Servers lacks %q:\n%s", want, page)
		}
	}

	// a stops (drained, so that it claims j2 no more, then its turn
	// cancelled): its last heartbeat releases the token; b takes over and
	// claims.
	a.d.Drain()
	waitFor(t, "a's drain to begin", 10*time.Second, func() bool { return a.logs.has(MsgDrainStarted) })
	if _, err := c.st.CancelJob(ctx, j1.ID, c.now()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "j1 to end", 10*time.Second, ended(c, j1.ID))
	a.stopped(t, 15*time.Second)
	waitFor(t, "b to take over and claim j2", 10*time.Second, func() bool {
		return b.logs.has(diagnostics.MsgHostTokenInUseCleared) && b.logs.has(MsgTurnAccepted)
	})
	if got := c.job(j2.ID); len(got.Attempts) != 1 || got.State != wire.JobRunning {
		t.Fatalf("j2 after the takeover: %s, %+v", got.State, got.Attempts)
	}
	if s := servers(); s.Instance == nil || s.Instance.BootID != "boot-b" || s.Conflict != nil {
		t.Fatalf("after the takeover: instance %+v, conflict %+v", s.Instance, s.Conflict)
	}
	if _, err := c.st.CancelJob(ctx, j2.ID, c.now()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "j2 to end", 10*time.Second, ended(c, j2.ID))

	// b's handover restart on its machine: not refused, at once.
	b.cancel()
	b.stopped(t, 10*time.Second)
	b2 := startDaemon(t, c, machine("boot-b", func(cfg *Config) { cfg.StateDir = b.d.cfg.StateDir }))
	j3 := c.enqueue("hang")
	waitAccepted(t, b2)
	if b2.logs.has(diagnostics.MsgHostTokenInUse) {
		t.Fatalf("the restart was refused:\n%s", b2.logs)
	}
	if got := c.job(j3.ID); len(got.Attempts) != 1 || got.Attempts[0].LeaseOwner != "host-a" {
		t.Fatalf("j3: %+v", got.Attempts)
	}
	cc := startDaemon(t, c, machine("boot-c"))
	waitFor(t, "a third machine refused", 10*time.Second, func() bool { return cc.logs.has(diagnostics.MsgHostTokenInUse) })
	if _, err := c.st.CancelJob(ctx, j3.ID, c.now()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "j3 to end", 10*time.Second, ended(c, j3.ID))
	for _, r := range []*running{a, b, b2, cc} {
		r.logs.noSecrets(t, c.hostToken, userTok)
	}
}

// adminPageText is Admin → Servers' HTML.
func adminPageText(t *testing.T, c *cp, userTok string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, c.url+"/admin/servers", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth("admin", userTok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("Admin → Servers: %d %s", resp.StatusCode, b)
	}
	return string(b)
}
