package wire_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/wire"
)

func TestClassifyStatus(t *testing.T) {
	tests := []struct {
		status int
		want   wire.RetryClass
	}{
		{http.StatusRequestTimeout, wire.Transient},
		{http.StatusBadGateway, wire.Transient},
		{http.StatusServiceUnavailable, wire.Transient},
		{http.StatusGatewayTimeout, wire.Transient},
		{http.StatusConflict, wire.Definitive},
		{http.StatusGone, wire.Definitive},
		{http.StatusUnauthorized, wire.CredentialRefused},
		{http.StatusForbidden, wire.CredentialRefused},
		{http.StatusNotFound, wire.CredentialRefused},
		{http.StatusBadRequest, wire.Permanent},
		{http.StatusUnprocessableEntity, wire.Permanent},
		{http.StatusInternalServerError, wire.ServerFault},
		{http.StatusNotImplemented, wire.ServerFault},
		{http.StatusTooManyRequests, wire.ServerFault},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.status), func(t *testing.T) {
			if got := wire.ClassifyStatus(tt.status); got != tt.want {
				t.Fatalf("ClassifyStatus(%d) = %v, want %v", tt.status, got, tt.want)
			}
			err := fmt.Errorf("renew lease: %w", &wire.StatusError{Op: "renew", Status: tt.status})
			if got := wire.Classify(err); got != tt.want {
				t.Fatalf("Classify(wrapped %d) = %v, want %v", tt.status, got, tt.want)
			}
		})
	}
	if got := wire.Classify(&wire.TransportError{Op: "renew", Err: errors.New("connection reset")}); got != wire.Transient {
		t.Fatalf("transport error is %v, want transient", got)
	}
	if got := wire.Classify(context.Canceled); got != wire.Permanent {
		t.Fatalf("the caller's own cancel is %v, want permanent", got)
	}
}

// Errors from the client carry the operation, the status and the code, never
// the URL, the token or the answer's free text (R16).
func TestClientErrorsCarryNoSecrets(t *testing.T) {
	const token = "rdw_secret-token-value"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			t.Errorf("Authorization header not sent as a bearer token")
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusConflict)
		fmt.Fprintf(w, `{"code":"lease_lost","message":"attempt superseded, body text %s"}`, token)
	}))
	defer srv.Close()
	c := &wire.Client{BaseURL: srv.URL + "/", HTTP: srv.Client()}
	_, err := c.Renew(context.Background(), token, "job_1", wire.RenewRequest{AttemptRef: wire.AttemptRef{AttemptID: "att_1", LeaseGeneration: 1}})
	var se *wire.StatusError
	if !errors.As(err, &se) || se.Status != http.StatusConflict || se.Code != wire.CodeLeaseLost {
		t.Fatalf("err = %v, want a 409 lease_lost StatusError", err)
	}
	assertClean(t, err, token, srv.URL)

	srv.Close() // now nothing answers: a transport error
	_, err = c.Renew(context.Background(), token, "job_1", wire.RenewRequest{})
	var te *wire.TransportError
	if !errors.As(err, &te) {
		t.Fatalf("err = %T %v, want a TransportError", err, err)
	}
	assertClean(t, err, token, srv.URL)
}

func assertClean(t *testing.T, err error, secrets ...string) {
	t.Helper()
	for _, s := range append(secrets, "job_1", "/v1/") {
		if strings.Contains(err.Error(), s) {
			t.Fatalf("error %q contains %q", err, s)
		}
	}
}

func TestClaimNoContent(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != wire.PathClaim {
			t.Errorf("got %s %s", r.Method, r.URL.Path)
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	c := &wire.Client{BaseURL: srv.URL, HTTP: srv.Client()}
	if _, err := c.Claim(context.Background(), "rdh_x", wire.ClaimRequest{WaitMS: 10}); !errors.Is(err, wire.ErrNoClaim) {
		t.Fatalf("err = %v, want ErrNoClaim", err)
	}
}

// TestStatusErrorCarriesRetryAfter: a 429 or 503 answer's Retry-After, in
// seconds or as an HTTP date, reaches the caller's retry policy (K1);
// nonsense is ignored.
func TestStatusErrorCarriesRetryAfter(t *testing.T) {
	date := time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)
	tests := []struct {
		name   string
		status int
		header string
		min    time.Duration
		max    time.Duration
	}{
		{"seconds", http.StatusTooManyRequests, "7", 7 * time.Second, 7 * time.Second},
		{"date", http.StatusServiceUnavailable, date, 80 * time.Second, 90 * time.Second},
		{"none", http.StatusInternalServerError, "", 0, 0},
		{"nonsense", http.StatusServiceUnavailable, "soon", 0, 0},
		{"negative", http.StatusServiceUnavailable, "-3", 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tt.header != "" {
					w.Header().Set("Retry-After", tt.header)
				}
				w.WriteHeader(tt.status)
			}))
			defer srv.Close()
			c := &wire.Client{BaseURL: srv.URL}
			_, err := c.Finish(context.Background(), "tok", "job", wire.FinishRequest{})
			var se *wire.StatusError
			if !errors.As(err, &se) || se.Status != tt.status {
				t.Fatalf("err = %v, want HTTP %d", err, tt.status)
			}
			if se.RetryAfter < tt.min || se.RetryAfter > tt.max {
				t.Fatalf("RetryAfter = %v, want in [%v, %v]", se.RetryAfter, tt.min, tt.max)
			}
			if wire.Classify(err) != wire.Transient && wire.Classify(err) != wire.ServerFault {
				t.Fatalf("class %v, want one a report retries", wire.Classify(err))
			}
		})
	}
}
