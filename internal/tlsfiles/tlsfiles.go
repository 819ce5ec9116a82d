// Package tlsfiles turns the PEM files named by runnerd's and the control
// plane's TLS flags into tls.Configs: the client side (a CA added to the
// system's, an optional client certificate) that the daemon and every turn
// child build alike, and the server side, whose certificate is swapped
// atomically on a reload so that connections in flight keep theirs.
//
// Errors name the flag of the file and what is wrong with it, never a
// key's content.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"
)

// Flag names, as both commands spell them; errors name them.
const (
	FlagCAFile     = "--ca-file"
	FlagClientCert = "--tls-client-cert"
	FlagClientKey  = "--tls-client-key"
	FlagCert       = "--tls-cert"
	FlagKey        = "--tls-key"
	FlagClientCA   = "--client-ca"
)

// Client names the files of a control-plane client's TLS: a CA to trust
// beside the system's, and a certificate with its key for mTLS. The zero
// value is Go's defaults. It travels in the turn child's payload, so that
// the child trusts exactly what the daemon trusts.
type Client struct {
	CAFile   string `json:"ca_file,omitempty"`
	CertFile string `json:"cert_file,omitempty"`
	KeyFile  string `json:"key_file,omitempty"`
}

// Config reads the files and returns the client's tls.Config; nil (Go's
// defaults) when no file is named.
func (c Client) Config() (*tls.Config, error) {
	if c == (Client{}) {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CAFile != "" {
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool() // no system roots here: the CA alone
		}
		if err := addPEM(pool, FlagCAFile, c.CAFile); err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	pair, err := keyPair(FlagClientCert, c.CertFile, FlagClientKey, c.KeyFile)
	if err != nil {
		return nil, err
	}
	cfg.GetClientCertificate = func(cri *tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return clientCertificate(pair, cri, time.Now())
	}
	return cfg, nil
}

// ClientCertPrefix begins the errors of a client certificate the server
// asked for and would refuse; diagnostics classes them tls_client_certificate.
const ClientCertPrefix = "tls: client certificate: "

// clientCertificate answers a server's request for a client certificate.
// One the server would refuse — none, another CA's, an expired one — ends
// the handshake here with an error that says which: the server's own
// refusal comes after a TLS 1.3 handshake, and HTTP/2 loses its reason.
func clientCertificate(pair *tls.Certificate, cri *tls.CertificateRequestInfo, now time.Time) (*tls.Certificate, error) {
	switch {
	case pair == nil:
		return nil, errors.New(ClientCertPrefix + "the server requires one and none is configured (" + FlagClientCert + ")")
	case now.After(pair.Leaf.NotAfter) || now.Before(pair.Leaf.NotBefore):
		return nil, fmt.Errorf("%s%s is valid from %s to %s only", ClientCertPrefix, FlagClientCert,
			pair.Leaf.NotBefore.UTC().Format(time.RFC3339), pair.Leaf.NotAfter.UTC().Format(time.RFC3339))
	case len(cri.AcceptableCAs) > 0 && cri.SupportsCertificate(pair) != nil:
		return nil, fmt.Errorf("%s%s is signed by a CA the server does not accept (its --client-ca)", ClientCertPrefix, FlagClientCert)
	}
	return pair, nil
}

// Server is the control plane's TLS: a certificate that Reload replaces
// without touching connections already made (each handshake takes the
// certificate current then), and an optional CA whose client certificates
// are required (mTLS).
type Server struct {
	certFile, keyFile string
	clientCAs         *x509.CertPool // nil: no client certificate asked for
	// cert is the pair handshakes use; Reload swaps it whole.
	cert atomic.Pointer[tls.Certificate]
}

// NewServer reads the pair (and the client CA, when clientCAFile is not
// empty); both of the pair's files are required.
func NewServer(certFile, keyFile, clientCAFile string) (*Server, error) {
	if certFile == "" && keyFile == "" {
		return nil, fmt.Errorf("%s needs %s and %s", FlagClientCA, FlagCert, FlagKey)
	}
	s := &Server{certFile: certFile, keyFile: keyFile}
	if clientCAFile != "" {
		s.clientCAs = x509.NewCertPool()
		if err := addPEM(s.clientCAs, FlagClientCA, clientCAFile); err != nil {
			return nil, err
		}
	}
	if err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Reload reads the pair again. A pair that cannot be read or does not
// match leaves the current one in use and is the error.
func (s *Server) Reload() error {
	pair, err := keyPair(FlagCert, s.certFile, FlagKey, s.keyFile)
	if err != nil {
		return err
	}
	s.cert.Store(pair)
	return nil
}

// Leaf is the certificate in use.
func (s *Server) Leaf() *x509.Certificate { return s.cert.Load().Leaf }

// Config is the server's tls.Config: every handshake gets the pair in use
// at its time.
func (s *Server) Config() *tls.Config {
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return s.cert.Load(), nil
		},
	}
	if s.clientCAs != nil {
		cfg.ClientCAs = s.clientCAs
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg
}

// keyPair loads a certificate and its key; nil when neither is named.
func keyPair(certFlag, certFile, keyFlag, keyFile string) (*tls.Certificate, error) {
	switch {
	case certFile == "" && keyFile == "":
		return nil, nil
	case keyFile == "":
		return nil, fmt.Errorf("%s %s needs %s", certFlag, certFile, keyFlag)
	case certFile == "":
		return nil, fmt.Errorf("%s %s needs %s", keyFlag, keyFile, certFlag)
	}
	certPEM, err := readFile(certFlag, certFile)
	if err != nil {
		return nil, err
	}
	keyPEM, err := readFile(keyFlag, keyFile)
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		// X509KeyPair's errors say what is wrong (no PEM, a key that does
		// not match), never the key itself.
		return nil, fmt.Errorf("%s %s and %s %s: %w", certFlag, certFile, keyFlag, keyFile, err)
	}
	return &pair, nil
}

// addPEM adds every certificate of the file to pool; a file with none is
// an error.
func addPEM(pool *x509.CertPool, flag, path string) error {
	b, err := readFile(flag, path)
	if err != nil {
		return err
	}
	if !pool.AppendCertsFromPEM(b) {
		return fmt.Errorf("%s %s: no PEM certificate in the file", flag, path)
	}
	return nil
}

func readFile(flag, path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, fmt.Errorf("%s %s: %w", flag, path, err)
	}
	return b, nil
}
