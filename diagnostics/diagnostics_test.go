package diagnostics

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runnerd/runnerd/wire"
)

const secret = "tok-SECRET-4242"

// realTLSError performs a real TLS handshake against a peer that answers in
// plain HTTP, over an in-memory pipe.
func realTLSError(t *testing.T) error {
	c, s := net.Pipe()
	defer c.Close()
	go func() {
		defer s.Close()
		buf := make([]byte, 4096)
		s.Read(buf)
		io.WriteString(s, "HTTP/1.1 400 Bad Request\r\n\r\n")
	}()
	err := tls.Client(c, &tls.Config{ServerName: "cp.example"}).Handshake()
	if err == nil {
		t.Fatal("handshake with a plain-text peer succeeded")
	}
	return err
}

// realRefused dials a loopback port nobody listens on (outside any bubble).
func realRefused(t *testing.T) error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err == nil {
		conn.Close()
		t.Skip("port reused by someone else")
	}
	return err
}

func TestR16Classifier(t *testing.T) {
	ctxTimeout, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	<-ctxTimeout.Done()

	// A real wire.Client call against a real server answering 503 with a
	// body and a code, carrying the token in its header.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"code":"internal","message":"body text `+secret+`"}`)
	}))
	defer srv.Close()
	wc := &wire.Client{BaseURL: srv.URL + "/" + secret, HTTP: srv.Client()}
	_, statusErr := wc.Renew(context.Background(), secret, "job-"+secret, wire.RenewRequest{})

	// A real client timeout: the server never answers within the limit.
	hang := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	defer slow.Close()
	defer close(hang)
	hc := slow.Client()
	hc.Timeout = 50 * time.Millisecond
	_, timeoutErr := (&wire.Client{BaseURL: slow.URL, HTTP: hc}).Renew(context.Background(), secret, "j", wire.RenewRequest{})

	tests := []struct {
		name string
		err  error
		want string
	}{
		{"nil", nil, ""},
		{"wire status 503", statusErr, "http_503"},
		{"wrapped status 409", fmt.Errorf("renew %s: %w", secret, &wire.StatusError{Op: "renew", Status: 409}), "http_409"},
		{"real client timeout", timeoutErr, ClassTimeout},
		{"context deadline", ctxTimeout.Err(), ClassTimeout},
		{"deadline on a conn", os.ErrDeadlineExceeded, ClassTimeout},
		{"canceled", fmt.Errorf("x: %w", context.Canceled), ClassCanceled},
		{"real connection refused", realRefused(t), ClassConnectionRefused},
		{"dns", &wire.TransportError{Op: "renew", Err: &net.OpError{Op: "dial", Err: &net.DNSError{Err: "no such host", Name: "cp." + secret}}}, ClassDNS},
		{"real tls to a plain-text peer", realTLSError(t), ClassTLSPlainHTTP},
		{"reset", &net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, ClassReset},
		{"broken pipe", &net.OpError{Op: "write", Err: os.NewSyscallError("write", syscall.EPIPE)}, ClassBrokenPipe},
		{"unreachable", &net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.EHOSTUNREACH)}, ClassUnreachable},
		{"eof", &wire.TransportError{Op: "renew", Err: io.EOF}, ClassEOF},
		{"unexpected eof", io.ErrUnexpectedEOF, ClassEOF},
		{"closed", net.ErrClosed, ClassClosed},
		{"bad answer", &wire.TransportError{Op: "renew", Err: fmt.Errorf("decode answer: %w", &json.SyntaxError{})}, ClassBadAnswer},
		{"other", errors.New("something " + secret), ClassOther},
	}
	shape := regexp.MustCompile(`^([a-z_]+|http_[0-9]{3})?$`)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Class(tt.err)
			if got != tt.want {
				t.Fatalf("Class(%v) = %q, want %q", tt.err, got, tt.want)
			}
			if !shape.MatchString(got) || strings.Contains(got, secret) {
				t.Fatalf("class %q is not a bare class", got)
			}
		})
	}
	if Status(statusErr) != 503 || Status(timeoutErr) != 0 || Status(nil) != 0 {
		t.Fatalf("Status: %d %d %d", Status(statusErr), Status(timeoutErr), Status(nil))
	}
}

// captured decodes every JSON record written to buf.
func captured(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	dec := json.NewDecoder(buf)
	for dec.More() {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

func keys(m map[string]any) []string {
	var ks []string
	for k := range m {
		if k != "time" && k != "level" && k != "msg" {
			ks = append(ks, k)
		}
	}
	sort.Strings(ks)
	return ks
}

// Every helper writes its own message name with exactly its fields; the
// endings of R18 are distinct names; failure records carry a class and a
// status, never the error's text.
func TestR15R18RecordsHaveFixedNamesAndFields(t *testing.T) {
	var buf bytes.Buffer
	rec := NewRecorder(slog.New(slog.NewJSONHandler(&buf, nil)))
	ctx := context.Background()
	a := Attempt{JobID: "job-1", AttemptID: "att-1"}
	leak := fmt.Errorf("POST http://cp.example/v1/agent/worker/jobs/job-1/renew token %s: %w", secret, &wire.StatusError{Op: "renew", Status: 503})

	rec.AttemptClaimed(ctx, a, 3, "worker-1", "host-1")
	rec.ControlFailure(ctx, "renew", a, leak)
	rec.HeartbeatRetry(ctx, a, 2, 55*time.Second, 5*time.Second)
	rec.HeartbeatRecovered(ctx, a, 5, 75*time.Second)
	rec.LeaseExpired(ctx, a, 6, 120*time.Second, leak)
	rec.LeaseLost(ctx, a, 409)
	rec.CredentialRefused(ctx, a, 401)
	rec.HeartbeatStopped(ctx, a, 12)
	rec.ExecutionTimeout(ctx, a, time.Hour)
	rec.TurnCancelled(ctx, a, CancelByUser)
	rec.AgentExit(ctx, a, 0, "")
	rec.ConfigIgnored(ctx, "AGENT_LEASE_TTL", 20*time.Second, 120*time.Second, "shorter than interval plus request timeout")
	rec.EventsDropped(ctx, a, 20)
	rec.TurnFailed(ctx, a, StagePreparation, "bad_answer")
	NewRecorder(nil).ControlFailure(ctx, "renew", a, leak) // discards, must not panic

	ids := []string{KeyAttemptID, KeyJobID}
	want := []struct {
		msg    string
		fields []string
	}{
		{MsgAttemptClaimed, append([]string{KeyHostID, KeyGeneration, KeyWorkerID}, ids...)},
		{MsgControlFailure, append([]string{KeyClass, KeyOp, KeyStatus}, ids...)},
		{MsgHeartbeatRetry, append([]string{KeyConsecutive, KeyNextDelay, KeySinceAck}, ids...)},
		{MsgHeartbeatRecovered, append([]string{KeyConsecutive, KeySinceAck}, ids...)},
		{MsgLeaseExpired, append([]string{KeyClass, KeyConsecutive, KeySinceAck, KeyStatus}, ids...)},
		{MsgLeaseLost, append([]string{KeyClass, KeyStatus}, ids...)},
		{MsgCredentialRefused, append([]string{KeyClass, KeyStatus}, ids...)},
		{MsgHeartbeatStopped, append([]string{KeyRenewals}, ids...)},
		{MsgExecutionTimeout, append([]string{KeyLimit}, ids...)},
		{MsgTurnCancelled, append([]string{KeySource}, ids...)},
		{MsgAgentExit, append([]string{KeyExitCode, KeySignal}, ids...)},
		{MsgConfigIgnored, []string{KeyGiven, KeyReason, KeySetting, KeyUsed}},
		{MsgEventsDropped, append([]string{KeyDropped}, ids...)},
		{MsgTurnFailed, append([]string{KeyClass, KeyStage}, ids...)},
	}
	recs := captured(t, &buf)
	if len(recs) != len(want) {
		t.Fatalf("%d records, want %d", len(recs), len(want))
	}
	names := map[string]bool{}
	for i, w := range want {
		got := recs[i]
		if got["msg"] != w.msg {
			t.Fatalf("record %d is %v, want %s", i, got["msg"], w.msg)
		}
		wf := slices.Clone(w.fields)
		sort.Strings(wf)
		if gk := keys(got); !slices.Equal(gk, wf) {
			t.Errorf("%s fields %v, want %v", w.msg, gk, wf)
		}
		if names[w.msg] {
			t.Errorf("record name %s used twice", w.msg)
		}
		names[w.msg] = true
	}
	cf := recs[1]
	if cf[KeyClass] != "http_503" || cf[KeyStatus] != float64(503) || cf[KeyOp] != "renew" {
		t.Errorf("control failure %v", cf)
	}
	if r := recs[2]; r[KeyConsecutive] != float64(2) || r[KeySinceAck] != float64(55000) || r[KeyNextDelay] != float64(5000) {
		t.Errorf("retry %v", r)
	}
	all, _ := json.Marshal(recs)
	for _, bad := range []string{secret, "http://", "cp.example", "/v1/", "POST"} {
		if bytes.Contains(all, []byte(bad)) {
			t.Errorf("records contain %q: %s", bad, all)
		}
	}
}
