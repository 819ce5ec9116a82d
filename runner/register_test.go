package runner

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// Issue 22 §1 and §2 with the real control plane and a real turn child:
// a daemon with no host token and a registration token registers itself
// (name and labels), stores its own token 0600 and works with it; a
// rotation with a grace reaches it through its next heartbeat answer,
// which it stores atomically, while its running turn goes on renewing on
// the same attempt; at the grace's end the old token is refused and the
// daemon, on the new one, stays online. Revoking the registration token
// changes nothing for it. No token is in its records.
func TestRegisterThenRotateWithAGrace(t *testing.T) {
	c := newCP(t)
	ctx := context.Background()
	regTok := controlplane.NewToken(controlplane.RegistrationTokenPrefix)
	rt, err := c.st.CreateRegistrationToken(ctx, store.RegistrationToken{Name: "fleet", Labels: wire.Labels{"pool": "a"}, MaxUses: 1}, controlplane.HashToken(regTok), store.Audit{Actor: "test"}, c.now())
	if err != nil {
		t.Fatal(err)
	}
	userTok := controlplane.NewToken(controlplane.UserTokenPrefix)
	if _, err := c.st.CreateUserToken(ctx, "ops", controlplane.HashToken(userTok), store.Audit{Actor: "test"}, c.now()); err != nil {
		t.Fatal(err)
	}
	stateDir := t.TempDir()
	tokenFile := filepath.Join(stateDir, "host-token")
	j := c.enqueue("hang")
	r := startDaemon(t, c, func(cfg *Config) {
		cfg.HostToken, cfg.RegistrationToken, cfg.HostTokenFile = "", regTok, tokenFile
		cfg.HostName, cfg.StateDir = "reg-1", stateDir
		cfg.Labels = wire.Labels{"pool": "a"}
	})
	defer func() {
		if t.Failed() {
			t.Logf("records:\n%s", r.logs)
		}
	}()
	readTok := func() string {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(b))
	}
	waitFor(t, "the host token file", 10*time.Second, func() bool { return readTok() != "" })
	first := readTok()
	if fi, err := os.Stat(tokenFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("host token file: %v %v; want 0600", fi.Mode(), err)
	}
	if h, err := c.st.HostByTokenHash(ctx, controlplane.HashToken(first)); err != nil || h.Name != "reg-1" {
		t.Fatalf("the stored token is host %+v, %v", h, err)
	}
	waitAccepted(t, r)
	if srv := c.server(t, "reg-1"); srv.Labels["pool"] != "a" {
		t.Fatalf("registered host = %+v", srv)
	}
	attempt := c.job(j.ID).Attempts[0]
	if attempt.LeaseOwner != "reg-1" {
		t.Fatalf("the turn runs on %s, not the registered host", attempt.LeaseOwner)
	}
	if _, err := c.st.RevokeRegistrationToken(ctx, rt.ID, store.Audit{Actor: "test"}, c.now()); err != nil {
		t.Fatal(err)
	}

	grace := time.Hour.Milliseconds()
	var tr wire.HostTokenResponse
	if _, err := c.wc.Do(ctx, http.MethodPost, "/v1/admin/hosts/reg-1/rotate-token", userTok, wire.RotateTokenRequest{GraceMS: &grace}, &tr); err != nil || tr.Token != "" {
		t.Fatalf("rotate-token: %+v, %v", tr, err)
	}
	waitFor(t, "the rotated token in the file", 10*time.Second, func() bool { t := readTok(); return t != "" && t != first })
	second := readTok()
	if h, err := c.st.HostByTokenHash(ctx, controlplane.HashToken(second)); err != nil || h.Name != "reg-1" || h.Previous != nil {
		t.Fatalf("the adopted token is %+v, %v", h, err)
	}
	if fi, _ := os.Stat(tokenFile); fi.Mode().Perm() != 0o600 {
		t.Fatalf("rotated host token file mode %v", fi.Mode())
	}
	// The turn goes on: the same attempt, its lease renewed after the pickup.
	renewedBefore := c.job(j.ID).Attempts[0].LeaseExpiresAt
	waitFor(t, "a renewal after the rotation", 10*time.Second, func() bool {
		return c.job(j.ID).Attempts[0].LeaseExpiresAt.After(renewedBefore)
	})
	if got := c.job(j.ID); got.State != wire.JobRunning || len(got.Attempts) != 1 || got.Attempts[0].ID != attempt.ID {
		t.Fatalf("the running turn after the rotation: %s, attempts %+v", got.State, got.Attempts)
	}

	// End the turn, then move the control plane past the grace.
	if _, err := c.st.CancelJob(ctx, j.ID, c.now()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the job to end", 10*time.Second, ended(c, j.ID))
	c.advance(time.Hour + time.Second)
	if _, err := c.wc.HostHeartbeat(ctx, first, wire.HostHeartbeat{}); !isStatus(err, http.StatusUnauthorized) {
		t.Fatalf("the old token after the grace: %v", err)
	}
	since := c.now()
	waitFor(t, "a heartbeat on the new token after the grace", 10*time.Second, func() bool {
		s := c.server(t, "reg-1")
		return s.LastHeartbeat != nil && !s.LastHeartbeat.Before(since)
	})
	if r.logs.has(MsgHostTokenRefused) {
		t.Fatal("the daemon's token was refused")
	}
	for _, msg := range []string{MsgHostRegistered, MsgHostTokenRotated} {
		if !r.logs.has(msg) {
			t.Errorf("no %s record", msg)
		}
	}
	r.logs.noSecrets(t, regTok, first, second, userTok)
}

// A registration the control plane refuses (here: the name is taken) ends
// Run with ErrRegistrationRefused carrying the server's reason, writes no
// token file and leaves no host behind.
func TestRegistrationRefusedEndsRun(t *testing.T) {
	c := newCP(t)
	ctx := context.Background()
	regTok := controlplane.NewToken(controlplane.RegistrationTokenPrefix)
	if _, err := c.st.CreateRegistrationToken(ctx, store.RegistrationToken{Name: "fleet"}, controlplane.HashToken(regTok), store.Audit{Actor: "test"}, c.now()); err != nil {
		t.Fatal(err)
	}
	stateDir := t.TempDir()
	tokenFile := filepath.Join(stateDir, "host-token")
	d, logs := newTestDaemon(t, c, func(cfg *Config) {
		cfg.HostToken, cfg.RegistrationToken, cfg.HostTokenFile = "", regTok, tokenFile
		cfg.HostName, cfg.StateDir = "host-a", stateDir // host-a is registered already
	})
	err := d.Run(ctx)
	var se *wire.StatusError
	if !errors.Is(err, ErrRegistrationRefused) || !errors.As(err, &se) || se.Code != wire.CodeHostExists || !strings.Contains(se.Message, "host-a") {
		t.Fatalf("Run = %v; want the registration refused as host_exists", err)
	}
	if _, err := os.Stat(tokenFile); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused registration left a token file: %v", err)
	}
	list, _ := c.st.ListRegistrationTokens(ctx)
	if list[0].Uses != 0 {
		t.Fatalf("a refused registration counted a use: %+v", list[0])
	}
	logs.noSecrets(t, regTok)
}

func isStatus(err error, status int) bool {
	var se *wire.StatusError
	return errors.As(err, &se) && se.Status == status
}
