package integration

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/internal/tlsfiles/tlstest"
	"github.com/runnerd/runnerd/wire"
)

// TestTLSTurnEndToEnd: a control plane on HTTPS that requires client
// certificates (--client-ca), a daemon with --ca-file and its client
// certificate. A turn runs end to end — claims and host heartbeats from
// the daemon, receipts, events and the settlement from the turn child,
// renewals on their own transport — so every client trusts the CA and
// shows the certificate. Then daemons that lack a piece are refused, each
// with a record naming why, and never reach the control plane: no CA,
// no client certificate, a CA that signed neither.
func TestTLSTurnEndToEnd(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{leaseTTL: calmLease, tls: true})
	if !strings.HasPrefix(e.cp.URL, "https://") {
		t.Fatalf("the control plane serves %s", e.cp.URL)
	}
	d := e.startDaemon(calm)
	conv := e.conversation("over tls")
	prompt := "a turn over TLS\n!events 3\n!silent " + (3 * 2 * time.Second).String() // past renewals
	j := e.send(conv.ID, prompt)
	got := e.waitEnded(j.ID)
	if got.State != wire.JobSucceeded || got.AttemptCount != 1 {
		t.Fatalf("the TLS turn: %s", describeJob(got))
	}
	e.assertPromptsOnce(conv.ID, prompt)
	out := d.Output()
	if strings.Contains(out, diagnostics.MsgControlPlanePlainHTTP) {
		t.Error("an https:// control plane was warned about as plain HTTP")
	}
	if !strings.Contains(out, `"tls_ca_file":true`) || !strings.Contains(out, `"tls_client_cert":true`) {
		t.Error("the start record does not say the TLS files are in use")
	}

	other := tlstest.NewCA(t, "other")
	for _, tt := range []struct {
		name  string
		args  []string
		class string
	}{
		{"no CA file", []string{"--tls-client-cert", e.tls.client.CertFile, "--tls-client-key", e.tls.client.KeyFile}, diagnostics.ClassTLSUnknownAuthority},
		{"wrong CA", []string{"--ca-file", other.File, "--tls-client-cert", e.tls.client.CertFile, "--tls-client-key", e.tls.client.KeyFile}, diagnostics.ClassTLSUnknownAuthority},
		{"no client certificate", []string{"--ca-file", e.tls.ca.File}, diagnostics.ClassTLSClientCert},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := e.daemonConfig()
			cfg.Args = tt.args
			cfg.StateDir = filepath.Join(e.dir, "state-"+sanitize(tt.name))
			cfg.HostName = e.host + "-refused"
			calm(&cfg)
			r, err := fleet.StartDaemon(e.ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			e.cleanupDaemon(r)
			for _, op := range []string{"claim", "host_heartbeat"} {
				rec := regexp.MustCompile(`\{.*"msg":"` + diagnostics.MsgControlFailure + `".*"op":"` + op + `".*\}`)
				lines, err := r.AwaitOutput(0, rec, waitFor)
				if err != nil {
					t.Fatalf("no %s failure record: %v\n%s", op, err, r.Output())
				}
				if !strings.Contains(lines[0], `"class":"`+tt.class+`"`) {
					t.Errorf("the %s refusal %s does not name %s", op, lines[0], tt.class)
				}
			}
			if strings.Contains(r.Output(), controlplane.HostTokenPrefix) {
				t.Error("a record shows a host token")
			}
		})
	}
}
