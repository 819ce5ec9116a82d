package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/internal/tlsfiles"
	"github.com/runnerd/runnerd/internal/tlsfiles/tlstest"
)

// tlsServe runs serve with args in-process; it returns the address it
// printed and a channel of its output lines after the first.
func tlsServe(t *testing.T, args ...string) (addr string, lines <-chan string) {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	served := make(chan int, 1)
	go func() {
		served <- run(ctx, append([]string{"serve", "--listen", "127.0.0.1:0", "--data-dir", t.TempDir()}, args...), noEnv, io.Discard, pw)
		pw.Close()
	}()
	sc := bufio.NewScanner(pr)
	if !sc.Scan() {
		t.Fatalf("serve printed nothing: %v", sc.Err())
	}
	_, addr, ok := strings.Cut(sc.Text(), "serving ")
	if !ok {
		t.Fatalf("first line %q does not name the address", sc.Text())
	}
	addr, _, _ = strings.Cut(addr, " ")
	out := make(chan string, 1000)
	go func() {
		defer close(out)
		for sc.Scan() {
			out <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		stop()
		if code := <-served; code != exitOK {
			t.Errorf("serve exit %d", code)
		}
		for range out {
		}
	})
	return addr, out
}

// waitLine waits for serve's line containing want (a record name); the
// bound is only against a hang.
func waitLine(t *testing.T, lines <-chan string, want string) string {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("serve ended before %q", want)
			}
			if strings.Contains(l, want) {
				return l
			}
		case <-timeout:
			t.Fatalf("no %q from serve", want)
		}
	}
}

// servedSerial is the serial of the certificate a GET /metrics over tr met.
func servedSerial(t *testing.T, tr *http.Transport, addr string) string {
	t.Helper()
	resp, err := (&http.Client{Transport: tr}).Get(addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body) // the connection goes back to the pool
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d", resp.StatusCode)
	}
	return resp.TLS.PeerCertificates[0].SerialNumber.String()
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// serve --tls-cert/--tls-key serves HTTPS; SIGHUP reads the pair again:
// a mismatched pair is refused in a record and the old certificate stays,
// a good one serves new connections while a connection made before goes
// on.
func TestServeTLSReloadsOnSIGHUP(t *testing.T) {
	ca := tlstest.NewCA(t, "fleet")
	first := ca.Server("cp-1", []string{"127.0.0.1"}, tlstest.Options{})
	second := ca.Server("cp-2", []string{"127.0.0.1"}, tlstest.Options{})
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	copyFile(t, first.CertFile, cert)
	copyFile(t, first.KeyFile, key)

	addr, lines := tlsServe(t, "--tls-cert", cert, "--tls-key", key)
	if !strings.HasPrefix(addr, "https://") {
		t.Fatalf("serving %s, want https://", addr)
	}
	trust, err := tlsfiles.Client{CAFile: ca.File}.Config()
	if err != nil {
		t.Fatal(err)
	}
	kept := &http.Transport{TLSClientConfig: trust, MaxIdleConnsPerHost: 1}
	defer kept.CloseIdleConnections()
	if s := servedSerial(t, kept, addr); s != first.Cert.SerialNumber.String() {
		t.Fatalf("served %s, want the first certificate", s)
	}
	// Plain HTTP to the TLS port is no way in.
	if resp, err := http.Get(strings.Replace(addr, "https://", "http://", 1) + "/metrics"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("plain HTTP was served on the TLS port")
		}
	}

	copyFile(t, second.CertFile, cert) // the key is still the first's
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	l := waitLine(t, lines, controlplane.MsgTLSReloadFailed)
	if !strings.Contains(l, "private key does not match public key") || !strings.Contains(l, "--tls-cert "+cert) {
		t.Fatalf("the refusal does not say why: %s", l)
	}
	fresh := &http.Transport{TLSClientConfig: trust}
	defer fresh.CloseIdleConnections()
	if s := servedSerial(t, fresh, addr); s != first.Cert.SerialNumber.String() {
		t.Fatalf("after a refused reload a new connection met %s, want the first certificate", s)
	}

	copyFile(t, second.KeyFile, key)
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	l = waitLine(t, lines, controlplane.MsgTLSReloaded)
	if !strings.Contains(l, "cp-2") {
		t.Fatalf("the reload record does not name the new certificate: %s", l)
	}
	if s := servedSerial(t, kept, addr); s != first.Cert.SerialNumber.String() {
		t.Fatalf("the connection made before the reload now meets %s: it was dropped", s)
	}
	renewed := &http.Transport{TLSClientConfig: trust}
	defer renewed.CloseIdleConnections()
	if s := servedSerial(t, renewed, addr); s != second.Cert.SerialNumber.String() {
		t.Fatalf("a new connection met %s, want the reloaded certificate", s)
	}
}

// serve --client-ca refuses a client without a certificate of that CA:
// the client's error names it, and so does serve's record.
func TestServeClientCARequiresClientCertificates(t *testing.T) {
	ca := tlstest.NewCA(t, "fleet")
	pair := ca.Server("cp", []string{"127.0.0.1"}, tlstest.Options{})
	client := ca.Client("host-1", tlstest.Options{})
	addr, lines := tlsServe(t, "--tls-cert", pair.CertFile, "--tls-key", pair.KeyFile, "--client-ca", ca.File)

	with, err := tlsfiles.Client{CAFile: ca.File, CertFile: client.CertFile, KeyFile: client.KeyFile}.Config()
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{TLSClientConfig: with}
	defer tr.CloseIdleConnections()
	servedSerial(t, tr, addr)

	without, _ := tlsfiles.Client{CAFile: ca.File}.Config()
	bare := &http.Transport{TLSClientConfig: without}
	defer bare.CloseIdleConnections()
	resp, err := (&http.Client{Transport: bare}).Get(addr + "/metrics")
	if err == nil {
		resp.Body.Close()
		t.Fatalf("served %d to a client without a certificate", resp.StatusCode)
	}
	if c := diagnostics.Class(err); c != diagnostics.ClassTLSClientCert {
		t.Fatalf("class %q (%v), want %q", c, err, diagnostics.ClassTLSClientCert)
	}
	// A client that does not check first (not runnerd's: tlsfiles ends the
	// handshake itself) is refused by the server, whose record says why.
	other := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: without.RootCAs}}
	defer other.CloseIdleConnections()
	if resp, err := (&http.Client{Transport: other}).Get(addr + "/metrics"); err == nil {
		resp.Body.Close()
		t.Fatalf("served %d to a plain client without a certificate", resp.StatusCode)
	}
	waitLine(t, lines, "client didn't provide a certificate")
}
