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
	"syscall"

	"github.com/runnerd/runnerd/wire"
)

// Error classes. A class is one of these constants or "http_" followed by a
// status number, so it can never carry a message, a URL, a body or a token.
const (
	ClassTimeout           = "timeout"
	ClassConnectionRefused = "connection_refused"
	ClassDNS               = "dns"
	ClassTLS               = "tls"
	ClassReset             = "reset"
	ClassBrokenPipe        = "broken_pipe"
	ClassUnreachable       = "unreachable"
	ClassEOF               = "eof"
	ClassClosed            = "closed"
	ClassCanceled          = "canceled"
	ClassBadAnswer         = "bad_answer" // an answer that did not decode
	ClassOther             = "other"
)

// Class returns err's class: "" for nil, "http_503" for a status error, and
// otherwise the first of these that err is (wrapped at any depth): canceled,
// dns, tls, connection_refused, reset, broken_pipe, unreachable, timeout,
// eof, closed, bad_answer, other.
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
	case errors.As(err, &recErr), errors.As(err, &alertErr), errors.As(err, &verifyErr),
		errors.As(err, &authErr), errors.As(err, &hostErr), errors.As(err, &certErr):
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
