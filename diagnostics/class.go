package diagnostics

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/runnerd/runnerd/wire"
)

// Error classes. A class is one of these constants or "http_" followed by a
// status number, so it can never carry a message, a URL, a body or a token.
const (
	ClassTimeout           = "timeout"
	ClassConnectionRefused = "connection_refused"
	ClassDNS               = "dns"
	ClassTLS               = "tls" // a TLS failure none of the tls_ classes names
	// TLS failures by their reason, so that a refusal says what to fix.
	ClassTLSExpired          = "tls_expired"            // the server's certificate is expired or not yet valid
	ClassTLSUnknownAuthority = "tls_unknown_authority"  // the server's certificate is signed by no CA trusted here (--ca-file)
	ClassTLSHostname         = "tls_hostname"           // the server's certificate is not for the address's host name
	ClassTLSClientCert       = "tls_client_certificate" // the server refused this client's certificate, or its absence (mTLS)
	ClassTLSPlainHTTP        = "tls_plain_http"         // an https:// address answered in plain HTTP
	ClassReset               = "reset"
	ClassBrokenPipe          = "broken_pipe"
	ClassUnreachable         = "unreachable"
	ClassEOF                 = "eof"
	ClassClosed              = "closed"
	ClassCanceled            = "canceled"
	ClassBadAnswer           = "bad_answer" // an answer that did not decode
	ClassOther               = "other"
)

// Class returns err's class: "" for nil, "http_503" for a status error, and
// otherwise the first of these that err is (wrapped at any depth): canceled,
// dns, tls (one of the tls_ classes when the reason is known: tlsClass),
// connection_refused, reset, broken_pipe, unreachable, timeout, eof,
// closed, bad_answer, other.
func Class(err error) string {
	if err == nil {
		return ""
	}
	var se *wire.StatusError
	if errors.As(err, &se) {
		return StatusClass(se.Status)
	}
	var (
		dnsErr    *net.DNSError
		recErr    tls.RecordHeaderError
		alertErr  tls.AlertError
		verifyErr *tls.CertificateVerificationError
		authErr   x509.UnknownAuthorityError
		hostErr   x509.HostnameError
		certErr   x509.CertificateInvalidError
		netErr    net.Error
		syntaxErr *json.SyntaxError
		typeErr   *json.UnmarshalTypeError
	)
	switch {
	case errors.Is(err, context.Canceled):
		return ClassCanceled
	case errors.As(err, &dnsErr):
		return ClassDNS
	case errors.As(err, &certErr) && (certErr.Reason == x509.Expired):
		return ClassTLSExpired
	case errors.As(err, &authErr):
		return ClassTLSUnknownAuthority
	case errors.As(err, &hostErr):
		return ClassTLSHostname
	case clientCertRefused(err):
		return ClassTLSClientCert
	case errors.As(err, &recErr) && string(recErr.RecordHeader[:]) == "HTTP/",
		strings.Contains(err.Error(), plainHTTPAnswer):
		return ClassTLSPlainHTTP
	case errors.As(err, &recErr), errors.As(err, &alertErr), errors.As(err, &verifyErr), errors.As(err, &certErr):
		return ClassTLS
	case errors.Is(err, syscall.ECONNREFUSED):
		return ClassConnectionRefused
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNABORTED):
		return ClassReset
	case errors.Is(err, syscall.EPIPE):
		return ClassBrokenPipe
	case errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EHOSTUNREACH):
		return ClassUnreachable
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded),
		errors.As(err, &netErr) && netErr.Timeout():
		return ClassTimeout
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return ClassEOF
	case errors.Is(err, net.ErrClosed), errors.Is(err, io.ErrClosedPipe):
		return ClassClosed
	case errors.As(err, &syntaxErr), errors.As(err, &typeErr):
		return ClassBadAnswer
	}
	return ClassOther
}

// clientCertAlerts are the alerts a server sends a client about the
// client's certificate, as crypto/tls words them in the error it returns
// (an unexported type, and tls.AlertError only under QUIC): bad_certificate,
// unsupported_certificate, certificate_expired, certificate_unknown,
// unknown_ca, and TLS 1.3's certificate_required (none was sent).
var clientCertAlerts = []string{"bad certificate", "unsupported certificate", "expired certificate",
	"unknown certificate", "unknown certificate authority", "certificate required"}

// clientCertRefused reports whether err is the server's alert about this
// client's certificate.
func clientCertRefused(err error) bool {
	var alertErr tls.AlertError
	if errors.As(err, &alertErr) {
		switch alertErr {
		case 42, 43, 45, 46, 48, 116:
			return true
		}
	}
	// HTTP/2's transport keeps only the text of the handshake's error;
	// tlsfiles' own refusals begin "tls: client certificate: ".
	msg := err.Error()
	if strings.Contains(msg, "tls: client certificate: ") {
		return true
	}
	for _, a := range clientCertAlerts {
		if strings.Contains(msg, "remote error: tls: "+a) {
			return true
		}
	}
	return false
}

// plainHTTPAnswer is net/http's error when an https:// request met a plain
// HTTP server; it keeps no tls.RecordHeaderError to find.
const plainHTTPAnswer = "server gave HTTP response to HTTPS client"

// StatusClass is the class of an HTTP status: "http_503". Zero gives "".
func StatusClass(status int) string {
	if status == 0 {
		return ""
	}
	return "http_" + strconv.Itoa(status)
}

// Status is the HTTP status err carries (a *wire.StatusError), or 0.
func Status(err error) int {
	var se *wire.StatusError
	if errors.As(err, &se) {
		return se.Status
	}
	return 0
}
