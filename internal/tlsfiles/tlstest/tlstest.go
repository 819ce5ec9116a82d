// Package tlstest makes certificates for tests (crypto/x509, ECDSA P-256):
// a CA, and server and client certificates it signs, written as PEM files.
// Only tests import it.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority made for one test.
type CA struct {
	Cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	CertPEM []byte
	// File is the CA certificate's PEM file.
	File string
	dir  string
	t    testing.TB
}

// NewCA makes a CA whose files go to a temporary directory of t's.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &CA{Cert: cert, key: key, CertPEM: pemOf("CERTIFICATE", der), dir: t.TempDir(), t: t}
	ca.File = ca.write(name+"-ca.pem", ca.CertPEM)
	return ca
}

// Pair is a certificate and its key as files.
type Pair struct {
	CertFile, KeyFile string
	Cert              *x509.Certificate
}

// Options shape a certificate; the zero value is valid for a day.
type Options struct {
	NotBefore, NotAfter time.Time
}

// Server makes a server certificate for hosts (names or IP addresses).
func (ca *CA) Server(name string, hosts []string, o Options) Pair {
	tmpl := ca.template(name, o)
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return ca.sign(name, tmpl)
}

// Client makes a client certificate named name.
func (ca *CA) Client(name string, o Options) Pair {
	tmpl := ca.template(name, o)
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	return ca.sign(name, tmpl)
}

func (ca *CA) template(name string, o Options) *x509.Certificate {
	if o.NotBefore.IsZero() {
		o.NotBefore = time.Now().Add(-time.Hour)
	}
	if o.NotAfter.IsZero() {
		o.NotAfter = time.Now().Add(24 * time.Hour)
	}
	return &x509.Certificate{
		SerialNumber: serial(ca.t),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    o.NotBefore,
		NotAfter:     o.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
}

func (ca *CA) sign(name string, tmpl *x509.Certificate) Pair {
	ca.t.Helper()
	key := newKey(ca.t)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		ca.t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		ca.t.Fatal(err)
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		ca.t.Fatal(err)
	}
	return Pair{
		CertFile: ca.write(name+".pem", pemOf("CERTIFICATE", der)),
		KeyFile:  ca.write(name+"-key.pem", pemOf("PRIVATE KEY", kb)),
		Cert:     cert,
	}
}

func (ca *CA) write(name string, b []byte) string {
	ca.t.Helper()
	p := filepath.Join(ca.dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		ca.t.Fatal(err)
	}
	return p
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func pemOf(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
