package tlsfiles_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/internal/tlsfiles"
	"github.com/runnerd/runnerd/internal/tlsfiles/tlstest"
	"github.com/runnerd/runnerd/wire"
)

const secret = "rhk_secret-token-never-shown"

// tlsServer is a server on loopback over TLS with srv's config, served as
// controlplane serve does (http.Server.ServeTLS, HTTP/2 included).
type tlsServer struct{ URL string }

func serveTLS(t *testing.T, srv *tlsfiles.Server) tlsServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{}`))
		}),
		TLSConfig: srv.Config(),
		ErrorLog:  log.New(io.Discard, "", 0),
	}
	go hs.ServeTLS(ln, "", "")
	t.Cleanup(func() { hs.Close() })
	return tlsServer{URL: "https://" + ln.Addr().String()}
}

// heartbeat makes one call over a client built from files, as the daemon
// and the turn child do.
func heartbeat(t *testing.T, url string, files tlsfiles.Client, h2 bool) error {
	t.Helper()
	cfg, err := files.Config()
	if err != nil {
		t.Fatalf("client config: %v", err)
	}
	tr := &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: h2}
	defer tr.CloseIdleConnections()
	c := &wire.Client{BaseURL: url, HTTP: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
	_, err = c.HostHeartbeat(context.Background(), secret, wire.HostHeartbeat{Capacity: 1})
	if err != nil && strings.Contains(err.Error(), secret) {
		t.Fatalf("the error shows the token: %v", err)
	}
	return err
}

// Each refusal is an error whose class names its reason; a good pair and
// trust go through; nothing ever falls back to plain HTTP.
func TestClientRefusalsNameTheReason(t *testing.T) {
	ca := tlstest.NewCA(t, "fleet")
	other := tlstest.NewCA(t, "other")
	good := ca.Server("cp", []string{"127.0.0.1", "localhost"}, tlstest.Options{})
	expired := ca.Server("cp-expired", []string{"127.0.0.1"}, tlstest.Options{
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	wrongHost := ca.Server("cp-elsewhere", []string{"cp.elsewhere.example"}, tlstest.Options{})
	client := ca.Client("host-1", tlstest.Options{})
	strangerClient := other.Client("host-2", tlstest.Options{})
	expiredClient := ca.Client("host-3", tlstest.Options{NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})

	server := func(p tlstest.Pair, clientCA string) tlsServer {
		s, err := tlsfiles.NewServer(p.CertFile, p.KeyFile, clientCA)
		if err != nil {
			t.Fatal(err)
		}
		return serveTLS(t, s)
	}
	plain := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(plain.Close)

	tests := []struct {
		name  string
		url   string
		files tlsfiles.Client
		want  string // class; "" is success
	}{
		{"trusted", server(good, "").URL, tlsfiles.Client{CAFile: ca.File}, ""},
		{"no CA given: system roots only", server(good, "").URL, tlsfiles.Client{}, diagnostics.ClassTLSUnknownAuthority},
		{"wrong CA", server(good, "").URL, tlsfiles.Client{CAFile: other.File}, diagnostics.ClassTLSUnknownAuthority},
		{"expired", server(expired, "").URL, tlsfiles.Client{CAFile: ca.File}, diagnostics.ClassTLSExpired},
		{"wrong host name", server(wrongHost, "").URL, tlsfiles.Client{CAFile: ca.File}, diagnostics.ClassTLSHostname},
		{"mTLS with a client certificate", server(good, ca.File).URL,
			tlsfiles.Client{CAFile: ca.File, CertFile: client.CertFile, KeyFile: client.KeyFile}, ""},
		{"mTLS without a client certificate", server(good, ca.File).URL, tlsfiles.Client{CAFile: ca.File}, diagnostics.ClassTLSClientCert},
		{"mTLS with another CA's client certificate", server(good, ca.File).URL,
			tlsfiles.Client{CAFile: ca.File, CertFile: strangerClient.CertFile, KeyFile: strangerClient.KeyFile}, diagnostics.ClassTLSClientCert},
		{"mTLS with an expired client certificate", server(good, ca.File).URL,
			tlsfiles.Client{CAFile: ca.File, CertFile: expiredClient.CertFile, KeyFile: expiredClient.KeyFile}, diagnostics.ClassTLSClientCert},
		{"https to a plain HTTP server", strings.Replace(plain.URL, "http://", "https://", 1), tlsfiles.Client{CAFile: ca.File}, diagnostics.ClassTLSPlainHTTP},
	}
	for _, tt := range tests {
		for _, h2 := range []bool{false, true} { // the daemon's transports speak HTTP/2 when they can
			t.Run(fmt.Sprintf("%s/h2=%v", tt.name, h2), func(t *testing.T) {
				err := heartbeat(t, tt.url, tt.files, h2)
				if got := diagnostics.Class(err); got != tt.want {
					t.Fatalf("class %q (%v), want %q", got, err, tt.want)
				}
			})
		}
	}
}

// A reload swaps the certificate for new handshakes; a bad pair keeps the
// one in use and says why; a connection made before keeps working.
func TestServerReloadKeepsConnectionsAndRefusesBadPairs(t *testing.T) {
	ca := tlstest.NewCA(t, "fleet")
	first := ca.Server("cp-1", []string{"127.0.0.1"}, tlstest.Options{})
	second := ca.Server("cp-2", []string{"127.0.0.1"}, tlstest.Options{})
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	install := func(p tlstest.Pair) {
		for src, dst := range map[string]string{p.CertFile: certFile, p.KeyFile: keyFile} {
			b, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dst, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	install(first)
	srv, err := tlsfiles.NewServer(certFile, keyFile, "")
	if err != nil {
		t.Fatal(err)
	}
	hs := serveTLS(t, srv)
	cfg, err := tlsfiles.Client{CAFile: ca.File}.Config()
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{TLSClientConfig: cfg, MaxIdleConnsPerHost: 1}
	defer tr.CloseIdleConnections()
	served := func(tr *http.Transport) string {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, hs.URL, nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body) // so that the connection goes back to the pool
		return resp.TLS.PeerCertificates[0].SerialNumber.String()
	}
	if s := served(tr); s != first.Cert.SerialNumber.String() {
		t.Fatalf("served %s, want the first certificate", s)
	}

	// A key that does not match its certificate: refused, the first stays.
	b, _ := os.ReadFile(second.CertFile)
	os.WriteFile(certFile, b, 0o600)
	if err := srv.Reload(); err == nil || !strings.Contains(err.Error(), tlsfiles.FlagCert) {
		t.Fatalf("reload of a mismatched pair: %v", err)
	}
	if srv.Leaf().SerialNumber.Cmp(first.Cert.SerialNumber) != 0 {
		t.Fatal("a refused reload replaced the certificate")
	}
	fresh := &http.Transport{TLSClientConfig: cfg}
	defer fresh.CloseIdleConnections()
	if s := served(fresh); s != first.Cert.SerialNumber.String() {
		t.Fatalf("after a refused reload a new connection got %s", s)
	}

	install(second)
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	// The pooled connection was made before: it goes on, on its certificate.
	if s := served(tr); s != first.Cert.SerialNumber.String() {
		t.Fatalf("the kept connection now shows %s: it was dropped", s)
	}
	renewed := &http.Transport{TLSClientConfig: cfg}
	defer renewed.CloseIdleConnections()
	if s := served(renewed); s != second.Cert.SerialNumber.String() {
		t.Fatalf("a new connection got %s, want the reloaded certificate", s)
	}
}

// Flag mistakes are errors that name the flag: half a pair, a file that
// cannot be read, a CA file with no certificate.
func TestFlagMistakesNameTheFlag(t *testing.T) {
	ca := tlstest.NewCA(t, "fleet")
	p := ca.Client("host", tlstest.Options{})
	junk := filepath.Join(t.TempDir(), "junk.pem")
	os.WriteFile(junk, []byte("not a certificate\n"), 0o600)
	missing := filepath.Join(t.TempDir(), "missing.pem")
	for _, tt := range []struct {
		name  string
		files tlsfiles.Client
		want  string
	}{
		{"cert without key", tlsfiles.Client{CertFile: p.CertFile}, "--tls-client-cert " + p.CertFile + " needs --tls-client-key"},
		{"key without cert", tlsfiles.Client{KeyFile: p.KeyFile}, "--tls-client-key " + p.KeyFile + " needs --tls-client-cert"},
		{"missing CA file", tlsfiles.Client{CAFile: missing}, "--ca-file " + missing + ": no such file or directory"},
		{"CA file without a certificate", tlsfiles.Client{CAFile: junk}, "--ca-file " + junk + ": no PEM certificate"},
		{"key that is no key", tlsfiles.Client{CertFile: p.CertFile, KeyFile: junk}, "--tls-client-key " + junk},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.files.Config()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
	if _, err := tlsfiles.NewServer(p.CertFile, "", ""); err == nil || !strings.Contains(err.Error(), "--tls-cert "+p.CertFile+" needs --tls-key") {
		t.Fatalf("server cert without key: %v", err)
	}
	if cfg, err := (tlsfiles.Client{}).Config(); cfg != nil || err != nil {
		t.Fatalf("no files: %v, %v; want Go's defaults", cfg, err)
	}
}
