package wire

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Client is the thin protocol client: one method per call, no goroutines,
// no retries. Each caller brings its own *http.Client (the renewer has its
// own transport, R3) and owns its retry policy and deadline.
type Client struct {
	BaseURL string       // e.g. http://127.0.0.1:8080, no trailing slash needed
	HTTP    *http.Client // nil means http.DefaultClient
	// Header is set on every request (the daemon's instance headers).
	Header http.Header
}

// StatusError is a non-2xx answer. It carries the status and the stable
// code, never the URL, the token or the body's free text (R16).
type StatusError struct {
	Op     string
	Status int
	Code   string
	// Message is the error body's sentence for a person. Error leaves it
	// out, so that records stay the op, status and code; a command line
	// tool shows it.
	Message string
	// RetryAfter is the answer's Retry-After (seconds or an HTTP date), 0
	// when it had none. A retry policy waits at least this long (K1).
	RetryAfter time.Duration
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("%s: HTTP %d %s", e.Op, e.Status, e.Code)
}

// TransportError is a request that got no HTTP answer. The URL of the
// underlying *url.Error is dropped so that it cannot reach a record.
type TransportError struct {
	Op  string
	Err error
}

func (e *TransportError) Error() string { return e.Op + ": " + e.Err.Error() }
func (e *TransportError) Unwrap() error { return e.Err }

// Retry classes (architecture: "Retry classes, everywhere"). Which of
// them a call retries is its retry policy's choice (internal/retry): the
// receipts retry only Transient (R24), the terminal reports Transient and
// ServerFault (K1). Only Definitive and CredentialRefused are verdicts.
type RetryClass int

const (
	// Transient: transport errors and 408/502/503/504: no answer from the
	// application itself.
	Transient RetryClass = iota
	// Definitive: 409 and 410. The answer will not change.
	Definitive
	// CredentialRefused: 401/403/404 on an attempt-scoped call.
	CredentialRefused
	// Permanent: any other status (400 and the rest of 4xx): the request
	// itself is wrong, a bug of ours; no retry changes it, and it is no
	// verdict about the lease either.
	Permanent
	// ServerFault: 429 and every 5xx but 502/503/504: the server answered
	// without a verdict (overloaded, or failed inside; a 500 may follow a
	// commit).
	ServerFault
)

func (c RetryClass) String() string {
	switch c {
	case Transient:
		return "transient"
	case Definitive:
		return "definitive"
	case ServerFault:
		return "server_fault"
	case CredentialRefused:
		return "credential_refused"
	default:
		return "permanent"
	}
}

// Classify is the one place that decides what an error from this client
// means for retrying. A context cancellation of the caller's own is
// Permanent: the caller gave up, nothing is to be retried.
func Classify(err error) RetryClass {
	var se *StatusError
	if errors.As(err, &se) {
		return ClassifyStatus(se.Status)
	}
	if errors.Is(err, context.Canceled) {
		return Permanent
	}
	return Transient
}

// ClassifyStatus classifies an HTTP status.
func ClassifyStatus(status int) RetryClass {
	switch status {
	case http.StatusRequestTimeout, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return Transient
	case http.StatusConflict, http.StatusGone:
		return Definitive
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound:
		return CredentialRefused
	case http.StatusTooManyRequests:
		return ServerFault
	}
	if status >= 500 && status <= 599 {
		return ServerFault
	}
	return Permanent
}

// ErrNoClaim is returned by Claim when the long poll ended with 204.
var ErrNoClaim = errors.New("no turn to claim")

// Claim long-polls for a turn with the host token.
func (c *Client) Claim(ctx context.Context, hostToken string, req ClaimRequest) (Claim, error) {
	var out Claim
	status, err := c.do(ctx, "claim", PathClaim, hostToken, req, &out)
	if err == nil && status == http.StatusNoContent {
		return Claim{}, ErrNoClaim
	}
	return out, err
}

// Claims long-polls for up to req.MaxClaims turns with the host token: a
// batch answer for MaxClaims above 1, else the one claim (asked for
// without max_claims) as a batch of one. ErrNoClaim when the long poll
// ended with 204.
func (c *Client) Claims(ctx context.Context, hostToken string, req ClaimRequest) ([]Claim, error) {
	if req.MaxClaims <= 1 {
		req.MaxClaims = 0 // the request of one turn every control plane reads
		one, err := c.Claim(ctx, hostToken, req)
		if err != nil {
			return nil, err
		}
		return []Claim{one}, nil
	}
	var out ClaimBatch
	// Every claim of the batch carries its prompt: the answer may be as
	// large as that many single ones.
	status, err := c.send(ctx, "claim", http.MethodPost, PathClaim, hostToken, req, &out, int64(req.MaxClaims)*maxAnswerBytes)
	if err == nil && status == http.StatusNoContent {
		return nil, ErrNoClaim
	}
	if err == nil && len(out.Claims) == 0 {
		return nil, &TransportError{Op: "claim", Err: errors.New("decode answer: a batch of no claims")}
	}
	return out.Claims, err
}

// HostHeartbeat reports the host's status with the host token.
func (c *Client) HostHeartbeat(ctx context.Context, hostToken string, req HostHeartbeat) (HostHeartbeatResponse, error) {
	var out HostHeartbeatResponse
	_, err := c.do(ctx, "host_heartbeat", PathHostHeartbeat, hostToken, req, &out)
	return out, err
}

// Register registers the host with a registration token (RegisterRequest).
func (c *Client) Register(ctx context.Context, registrationToken string, req RegisterRequest) (RegisterResponse, error) {
	var out RegisterResponse
	_, err := c.do(ctx, "register", PathRegister, registrationToken, req, &out)
	return out, err
}

// ConversationStates asks, with the host token, whether the conversations
// are usable, lost or unknown to the control plane.
func (c *Client) ConversationStates(ctx context.Context, hostToken string, req ConversationStatesRequest) (ConversationStatesResponse, error) {
	var out ConversationStatesResponse
	_, err := c.do(ctx, "conversation_states", PathConversations, hostToken, req, &out)
	return out, err
}

// Cancels long-polls, with the host token, for the user's cancels of the
// host's running attempts among req.AttemptIDs; none within the wait is
// an empty answer.
func (c *Client) Cancels(ctx context.Context, hostToken string, req CancelsRequest) ([]string, error) {
	var out CancelsResponse
	status, err := c.do(ctx, "cancels", PathCancels, hostToken, req, &out)
	if err != nil || status == http.StatusNoContent {
		return nil, err
	}
	return out.AttemptIDs, nil
}

// PermissionAnswer waits up to req.WaitMS for the owner's answer to the
// attempt's permission request req.RequestID: the option chosen, or ""
// when none came within the wait.
func (c *Client) PermissionAnswer(ctx context.Context, workerToken, jobID string, req PermissionsRequest) (string, error) {
	var out PermissionsResponse
	status, err := c.do(ctx, OpPermissions, AttemptPath(jobID, OpPermissions), workerToken, req, &out)
	if err != nil || status == http.StatusNoContent {
		return "", err
	}
	return out.OptionID, nil
}

// Renew renews an attempt's lease with its worker token.
func (c *Client) Renew(ctx context.Context, workerToken, jobID string, req RenewRequest) (RenewResponse, error) {
	var out RenewResponse
	_, err := c.do(ctx, OpRenew, AttemptPath(jobID, OpRenew), workerToken, req, &out)
	return out, err
}

// Events uploads a batch of runner events.
func (c *Client) Events(ctx context.Context, workerToken, jobID string, req EventsRequest) (EventsResponse, error) {
	var out EventsResponse
	_, err := c.do(ctx, OpEvents, AttemptPath(jobID, OpEvents), workerToken, req, &out)
	return out, err
}

// Container records the retained sandbox's identity.
func (c *Client) Container(ctx context.Context, workerToken, jobID string, req ContainerRequest) error {
	_, err := c.do(ctx, OpContainer, AttemptPath(jobID, OpContainer), workerToken, req, &Empty{})
	return err
}

// Admission asks for the admission receipt.
func (c *Client) Admission(ctx context.Context, workerToken, jobID string, req AdmissionRequest) (AdmissionReceipt, error) {
	var out AdmissionReceipt
	_, err := c.do(ctx, OpAdmission, AttemptPath(jobID, OpAdmission), workerToken, req, &out)
	return out, err
}

// Settlement records the settlement and returns the boundary.
func (c *Client) Settlement(ctx context.Context, workerToken, jobID string, req SettlementRequest) (Boundary, error) {
	var out Boundary
	_, err := c.do(ctx, OpSettlement, AttemptPath(jobID, OpSettlement), workerToken, req, &out)
	return out, err
}

// Notice sends a notice such as shared_workspace_settled.
func (c *Client) Notice(ctx context.Context, workerToken, jobID string, req NoticeRequest) error {
	_, err := c.do(ctx, OpNotices, AttemptPath(jobID, OpNotices), workerToken, req, &Empty{})
	return err
}

// Abandon ends a never-admitted attempt as failed, keeping the conversation usable.
func (c *Client) Abandon(ctx context.Context, workerToken, jobID string, req AbandonRequest) (FinishResponse, error) {
	var out FinishResponse
	_, err := c.do(ctx, OpAbandon, AttemptPath(jobID, OpAbandon), workerToken, req, &out)
	return out, err
}

// Release gives a never-accepted turn back to the queue.
func (c *Client) Release(ctx context.Context, workerToken, jobID string, req ReleaseRequest) error {
	_, err := c.do(ctx, OpRelease, AttemptPath(jobID, OpRelease), workerToken, req, &Empty{})
	return err
}

// Finish sends the terminal report.
func (c *Client) Finish(ctx context.Context, workerToken, jobID string, req FinishRequest) (FinishResponse, error) {
	var out FinishResponse
	_, err := c.do(ctx, OpFinish, AttemptPath(jobID, OpFinish), workerToken, req, &out)
	return out, err
}

// Do is the general call for the user API and tools: method and path,
// bearer token, a JSON body (nil for none) and where to decode the answer
// (nil to discard it). It returns the status of a 2xx answer.
func (c *Client) Do(ctx context.Context, method, path, token string, body, out any) (int, error) {
	return c.send(ctx, strings.TrimPrefix(path, "/"), method, path, token, body, out, maxAnswerBytes)
}

func (c *Client) do(ctx context.Context, op, path, token string, body, out any) (int, error) {
	return c.send(ctx, op, http.MethodPost, path, token, body, out, maxAnswerBytes)
}

// maxAnswerBytes bounds the answer decoded of one call (a batch of claims:
// that many times).
const maxAnswerBytes = 16 * MaxBodyBytes

func (c *Client) send(ctx context.Context, op, method, path, token string, body, out any, limit int64) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, fmt.Errorf("%s: encode request: %w", op, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.BaseURL, "/")+path, rd)
	if err != nil {
		return 0, fmt.Errorf("%s: build request: %w", op, errors.Unwrap(err))
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range c.Header {
		req.Header[k] = v
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return 0, &TransportError{Op: op, Err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		var eb ErrorBody
		_ = json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&eb)
		return resp.StatusCode, &StatusError{Op: op, Status: resp.StatusCode, Code: eb.Code, Message: eb.Message,
			RetryAfter: RetryAfter(resp.Header.Get("Retry-After"), time.Now())}
	}
	if resp.StatusCode == http.StatusNoContent || out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, MaxBodyBytes))
		return resp.StatusCode, nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, limit)).Decode(out); err != nil {
		return resp.StatusCode, &TransportError{Op: op, Err: fmt.Errorf("decode answer: %w", err)}
	}
	return resp.StatusCode, nil
}

// RetryAfter reads a Retry-After header: delay seconds or an HTTP date.
// Anything unreadable, negative or past is 0. The retry policies read it
// (internal/retry) as StatusError.RetryAfter does.
func RetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
		if n <= 0 || n > int64(24*time.Hour/time.Second) {
			return 0
		}
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
