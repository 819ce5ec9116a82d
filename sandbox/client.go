package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/runnerd/runnerd/internal/boottime"
	"github.com/runnerd/runnerd/wire"
)

// Client speaks to one supervisor. It holds no connection between calls
// and starts no goroutine: each call dials, sends one request, reads its
// answer and closes — except Run, whose connection lives in the returned
// Turn, because it is the driving connection of the agent.
type Client struct {
	// Socket is the host path of the supervisor's unix socket. Paths longer
	// than a sockaddr holds are reached through /proc/self/fd.
	Socket string
	// DialTimeout bounds connecting; zero means 5 s.
	DialTimeout time.Duration
	// Version is the protocol version the supervisor speaks (its
	// Status.Version, which Ensure read: Sandbox.Version); zero means
	// ProtocolVersion. Requests go out at it, with only what it knows:
	// below Version2, Activate leaves the lease deadline out, and
	// SetDeadline and Interrupt fail with ErrOutdated without sending.
	Version int
}

// version is the version requests go out at.
func (c *Client) version() int {
	if c.Version <= 0 || c.Version > ProtocolVersion {
		return ProtocolVersion
	}
	return c.Version
}

// Status asks the supervisor how it is. A nil error is the proof that a
// supervisor answers on the socket; see Status.Busy for what busy means.
// It is the version probe, so it goes out at Version1, which every
// supervisor serves, and the answer's Version is never 0: a supervisor that
// says none speaks Version1.
func (c *Client) Status(ctx context.Context) (Status, error) {
	resp, err := c.call(ctx, Version1, Request{Op: OpStatus})
	if err != nil {
		return Status{}, err
	}
	if resp.Status == nil {
		return Status{}, protocolError(OpStatus, "no status in answer")
	}
	st := *resp.Status
	st.Version = max(st.Version, Version1)
	return st, nil
}

// Activate takes ownership of the sandbox with a fresh activation token.
// Every older token is fenced from then on: its calls are refused with
// ErrFenced, and an agent it still runs has been stopped (its process group
// killed and reaped) before Activate returns. The previous token's receipt
// is dropped (R26). leaseDeadline (CLOCK_BOOTTIME; 0 for none) is when the
// supervisor stops this activation's agent by itself (K5); SetDeadline
// moves it.
//
// Below Version2 the supervisor is not told the deadline (only the turn
// child then stops the agent at it) and retains no record (Previous is nil).
func (c *Client) Activate(ctx context.Context, leaseDeadline boottime.Instant) (Activation, error) {
	req := Request{Op: OpActivate, LeaseDeadline: leaseDeadline}
	if c.version() < Version2 {
		req.LeaseDeadline = 0
	}
	resp, err := c.call(ctx, c.version(), req)
	if err != nil {
		return Activation{}, err
	}
	if resp.Activation == nil || resp.Activation.ID == "" {
		return Activation{}, protocolError(OpActivate, "no activation in answer")
	}
	return *resp.Activation, nil
}

// SetDeadline gives the activation a new lease deadline (after a renewal
// the daemon saw acknowledged); the newest call wins. It fails with
// ErrFenced for a fenced token and ErrDeadlinePassed when the deadline it
// held already passed and stopped the turn.
func (c *Client) SetDeadline(ctx context.Context, activationID string, leaseDeadline boottime.Instant) error {
	if c.version() < Version2 {
		return outdated(OpDeadline, c.version())
	}
	resp, err := c.call(ctx, c.version(), Request{Op: OpDeadline, Activation: activationID, LeaseDeadline: leaseDeadline})
	if err != nil {
		return err
	}
	if resp.Deadline == nil || resp.Deadline.LeaseDeadline != leaseDeadline {
		return protocolError(OpDeadline, "deadline not confirmed")
	}
	return nil
}

// Settle returns the supervisor receipt of the activation's completed turn.
// A receipt says the agent ended on its own and nothing of the turn runs
// any more (its process group was killed once the agent exited); it does
// not say the agent succeeded — that is ExitCode's business. Asked again with the same token it returns the same receipt, until
// another activation takes ownership (R26). It fails with ErrBusy while the
// agent runs, ErrNotRun before a turn ran, ErrInterrupted for a turn that
// did not complete, ErrFenced for a fenced token and ErrUnknownActivation
// after a supervisor restart (R28): in each failure case there is no
// receipt, and the caller must not assume the turn settled.
func (c *Client) Settle(ctx context.Context, activationID string) (wire.SupervisorReceipt, error) {
	resp, err := c.call(ctx, c.version(), Request{Op: OpSettle, Activation: activationID})
	if err != nil {
		return wire.SupervisorReceipt{}, err
	}
	if resp.Receipt == nil || resp.Receipt.ReceiptID == "" {
		return wire.SupervisorReceipt{}, protocolError(OpSettle, "no receipt in answer")
	}
	return *resp.Receipt, nil
}

// Interrupt stops the activation's running turn on request (the user's
// cancel, K10) and settles an interrupted boundary: the agent's process
// group gets SIGINT, SIGKILL if it is still there grace later (0 for
// DefaultInterruptGrace), and once nothing of the turn runs the answer is
// the activation's receipt with Interrupted set — the same one Settle then
// returns (R26). A turn that ended on its own before the interrupt answers
// its ordinary receipt. It fails as Settle does when there is no receipt to
// give: ErrInterrupted for a turn stopped any other way (a dropped driving
// connection, the lease deadline), ErrNotRun, ErrFenced,
// ErrUnknownActivation. ctx must allow for grace.
func (c *Client) Interrupt(ctx context.Context, activationID string, grace time.Duration) (wire.SupervisorReceipt, error) {
	if c.version() < Version2 {
		return wire.SupervisorReceipt{}, outdated(OpInterrupt, c.version())
	}
	resp, err := c.call(ctx, c.version(), Request{Op: OpInterrupt, Activation: activationID, GraceMS: grace.Milliseconds()})
	if err != nil {
		return wire.SupervisorReceipt{}, err
	}
	if resp.Receipt == nil || resp.Receipt.ReceiptID == "" || resp.Receipt.ActivationID != activationID {
		return wire.SupervisorReceipt{}, protocolError(OpInterrupt, "no receipt for the activation in answer")
	}
	return *resp.Receipt, nil
}

// Prepare makes the conversation's ACP agent ready for the activation's
// turn, before admission: a running agent with its session is kept; else
// the agent is started, initialized, and its kept session loaded
// (session/load) or, for a conversation that has none yet, created
// (session/new with the workspace as cwd). No prompt is sent. It fails
// with ErrAgentUnresponsive (no answer within the supervisor's bound),
// ErrStartFailed (the agent could not be started or exited),
// ErrSessionNotLoadable (the kept session cannot be loaded: the agent does
// not advertise loadSession, refused it, or the session id was lost).
func (c *Client) Prepare(ctx context.Context, activationID string, command []string) (Prepared, error) {
	if c.version() < Version3 {
		return Prepared{}, outdated(OpPrepare, c.version())
	}
	resp, err := c.call(ctx, c.version(), Request{Op: OpPrepare, Activation: activationID, Command: command, Protocol: AgentProtocolACP})
	if err != nil {
		return Prepared{}, err
	}
	if resp.Prepared == nil {
		return Prepared{}, protocolError(OpPrepare, "expected prepared")
	}
	return *resp.Prepared, nil
}

// ACPOptions are an ACP turn's: its conversation's permission policy
// (wire.PermissionAllow, PermissionReject or PermissionAsk) and, under ask,
// how long a request waits for the owner (0: DefaultPermissionTimeout).
type ACPOptions struct {
	PermissionPolicy  string
	PermissionTimeout time.Duration
}

// RunACP is Run for a conversation of the ACP protocol: one session/prompt
// to the agent Prepare made ready. Under the ask policy a permission
// request is an event "permission_requested"; Turn.Answer answers it.
func (c *Client) RunACP(ctx context.Context, activationID, prompt string, o ACPOptions) (*Turn, error) {
	if c.version() < Version3 {
		return nil, outdated(OpRun, c.version())
	}
	return c.run(ctx, Request{Op: OpRun, Activation: activationID, Protocol: AgentProtocolACP, PermissionPolicy: o.PermissionPolicy,
		PermissionTimeoutMS: o.PermissionTimeout.Milliseconds(), Prompt: prompt})
}

// Run hands the prompt to the agent — once — and returns the turn's event
// stream. It must be called only after the admission acknowledgement
// (R25); the caller (settlement.SendPrompt) gates it.
//
// The prompt is sent exactly once on a fresh connection; Run never retries.
// The supervisor refuses a second run of the same activation with
// ErrAlreadyRun, even one that arrives after a lost answer, so a prompt
// cannot reach the agent twice through one activation, and a fenced token
// cannot run at all.
//
// Run's error wraps ErrInterrupted exactly when the prompt may have reached
// the agent (the request went out and no refusal came back): treat that
// turn as admitted and uncertain, and never send the prompt again. Every
// other error (ErrUnavailable, ErrFenced, ErrUnknownActivation,
// ErrAlreadyRun, ErrStartFailed, ErrProtocol) is a certain non-delivery.
//
// ctx governs the whole turn, not just the call: cancelling it (an
// execution timeout, R5, or a lost lease) or calling Turn.Close before the
// end closes the driving connection, and the supervisor stops the agent.
func (c *Client) Run(ctx context.Context, activationID string, command []string, prompt string) (*Turn, error) {
	if len(command) == 0 {
		return nil, fmt.Errorf("supervisor run: %w: empty agent command", ErrProtocol)
	}
	return c.run(ctx, Request{Op: OpRun, Activation: activationID, Command: command, Prompt: prompt})
}

func (c *Client) run(ctx context.Context, req Request) (*Turn, error) {
	msg, err := encodeRequest(c.version(), req)
	if err != nil {
		return nil, fmt.Errorf("supervisor run: %w", err)
	}
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	t := &Turn{conn: conn, r: bufio.NewReaderSize(conn, 64<<10)}
	t.stop = context.AfterFunc(ctx, func() { conn.Close() })
	if _, err := conn.Write(msg); err != nil {
		t.Close()
		return nil, fmt.Errorf("supervisor run: send: %w: %w", ErrInterrupted, err)
	}
	resp, err := readResponse(t.r)
	if err != nil {
		t.Close()
		return nil, fmt.Errorf("supervisor run: %w: %w", ErrInterrupted, err)
	}
	if resp.Error != nil {
		t.Close()
		return nil, replyError(OpRun, resp.Error)
	}
	if resp.Started == nil {
		t.Close()
		return nil, protocolError(OpRun, "expected started")
	}
	t.PID = resp.Started.PID
	return t, nil
}

// Turn is a running agent turn: its event stream and, at the end, its
// result. It is not safe for concurrent use; one goroutine reads it.
type Turn struct {
	// PID is the agent's process id inside the sandbox (for records).
	PID int

	conn   net.Conn
	wmu    sync.Mutex // serialises Answer's writes
	r      *bufio.Reader
	stop   func() bool
	result *Result
	err    error
}

// Next returns the next agent event. At the end of a turn that completed it
// returns io.EOF, and Result has the outcome. Any other error ends the
// stream: ErrInterrupted (wrapped) when the connection broke or the turn was
// stopped, ErrFenced when a newer activation stopped it.
func (t *Turn) Next() (Event, error) {
	if t.err != nil {
		return Event{}, t.err
	}
	resp, err := readResponse(t.r)
	switch {
	case err != nil:
		t.fail(fmt.Errorf("supervisor run: %w: %w", ErrInterrupted, err))
	case resp.Error != nil:
		t.fail(replyError(OpRun, resp.Error))
	case resp.Event != nil:
		return *resp.Event, nil
	case resp.End != nil:
		r := *resp.End
		t.result = &r
		t.fail(io.EOF)
	default:
		t.fail(protocolError(OpRun, "unexpected message in stream"))
	}
	return Event{}, t.err
}

// Answer sends the owner's answer to a pending permission request of an
// ACP turn (the "request_id" of its "permission_requested" event). It may
// be called while another goroutine reads the turn.
func (t *Turn) Answer(requestID, optionID string) error {
	msg, err := encodeRequest(Version3, Request{Op: OpAnswer, RequestID: requestID, OptionID: optionID})
	if err != nil {
		return err
	}
	t.wmu.Lock()
	defer t.wmu.Unlock()
	_, err = t.conn.Write(msg)
	return err
}

// Result is the turn's outcome once Next returned io.EOF; before that, or
// when the stream ended otherwise, it returns the error that ended it (or
// ErrBusy if the stream is still open).
func (t *Turn) Result() (Result, error) {
	if t.result != nil {
		return *t.result, nil
	}
	if t.err != nil {
		return Result{}, t.err
	}
	return Result{}, fmt.Errorf("supervisor run: %w", ErrBusy)
}

// Close drops the driving connection. Before the end this stops the agent
// and interrupts the turn; after it, it only frees the connection.
func (t *Turn) Close() error {
	if t.err == nil {
		t.err = fmt.Errorf("supervisor run: %w: closed by the caller", ErrInterrupted)
	}
	t.stop()
	return t.conn.Close()
}

func (t *Turn) fail(err error) {
	t.err = err
	t.stop()
	t.conn.Close()
}

// call sends one request at version v and reads its single answer.
func (c *Client) call(ctx context.Context, v int, req Request) (Response, error) {
	msg, err := encodeRequest(v, req)
	if err != nil {
		return Response{}, fmt.Errorf("supervisor %s: %w", req.Op, err)
	}
	conn, err := c.dial(ctx)
	if err != nil {
		return Response{}, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if _, err := conn.Write(msg); err != nil {
		return Response{}, fmt.Errorf("supervisor %s: %w: %w", req.Op, ErrUnavailable, err)
	}
	resp, err := readResponse(bufio.NewReaderSize(conn, 64<<10))
	if err != nil {
		if ctx.Err() != nil {
			return Response{}, fmt.Errorf("supervisor %s: %w", req.Op, ctx.Err())
		}
		return Response{}, fmt.Errorf("supervisor %s: %w: %w", req.Op, ErrUnavailable, err)
	}
	if resp.Error != nil {
		return Response{}, replyError(req.Op, resp.Error)
	}
	return resp, nil
}

func (c *Client) dial(ctx context.Context) (net.Conn, error) {
	timeout := c.DialTimeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	conn, err := DialUnix(ctx, c.Socket, timeout)
	if err != nil {
		return nil, fmt.Errorf("supervisor: %w: %w", ErrUnavailable, err)
	}
	return conn, nil
}

// encodeRequest is the request as one line, refused before anything is
// sent when it is over MaxMessageBytes (a prompt too large never leaves).
func encodeRequest(v int, req Request) ([]byte, error) {
	req.V = v
	b, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	if len(b)+1 > MaxMessageBytes {
		return nil, fmt.Errorf("%w: request of %d bytes is over the limit", ErrProtocol, len(b))
	}
	return append(b, '\n'), nil
}

// ReadLine reads one newline-terminated message of at most max bytes. A
// longer line is an error (ErrProtocol), not a partial message.
func ReadLine(r *bufio.Reader, max int) ([]byte, error) {
	var buf []byte
	for {
		chunk, err := r.ReadSlice('\n')
		if len(buf)+len(chunk) > max {
			return nil, fmt.Errorf("%w: message over %d bytes", ErrProtocol, max)
		}
		buf = append(buf, chunk...)
		switch {
		case err == nil:
			return bytes.TrimSuffix(buf, []byte{'\n'}), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(buf) > 0:
			return nil, io.ErrUnexpectedEOF
		default:
			return nil, err
		}
	}
}

func readResponse(r *bufio.Reader) (Response, error) {
	line, err := ReadLine(r, MaxMessageBytes)
	if err != nil {
		return Response{}, err
	}
	var resp Response
	if err := json.Unmarshal(line, &resp); err != nil {
		return Response{}, fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	return resp, nil
}

var codeErrors = map[string]error{
	CodeFenced:            ErrFenced,
	CodeUnknownActivation: ErrUnknownActivation,
	CodeAlreadyRun:        ErrAlreadyRun,
	CodeBusy:              ErrBusy,
	CodeNotRun:            ErrNotRun,
	CodeInterrupted:       ErrInterrupted,
	CodeProtocol:          ErrProtocol,
	CodeStartFailed:       ErrStartFailed,
	CodeDeadlinePassed:    ErrDeadlinePassed,
	CodeOutdated:          ErrOutdated,
	CodeAgentUnresponsive: ErrAgentUnresponsive,
	CodeNotLoadable:       ErrSessionNotLoadable,
}

// CodeOf is the protocol code of a sentinel error; CodeProtocol for
// anything else.
func CodeOf(err error) string {
	for code, sentinel := range codeErrors {
		if errors.Is(err, sentinel) {
			return code
		}
	}
	return CodeProtocol
}

// ReplyOf is the supervisor's side of replyError: the code of err's
// sentinel and, as the message, whatever err says beyond it.
func ReplyOf(err error) *ErrorReply {
	code := CodeOf(err)
	msg := err.Error()
	if sentinel, ok := codeErrors[code]; ok {
		msg = strings.TrimPrefix(strings.TrimPrefix(msg, sentinel.Error()), ": ")
	}
	return &ErrorReply{Code: code, Message: msg}
}

func replyError(op string, e *ErrorReply) error {
	sentinel, ok := codeErrors[e.Code]
	if !ok {
		sentinel = ErrProtocol
	}
	if e.Message == "" {
		return fmt.Errorf("supervisor %s: %w", op, sentinel)
	}
	return fmt.Errorf("supervisor %s: %w: %s", op, sentinel, e.Message)
}

func outdated(op string, v int) error {
	return fmt.Errorf("supervisor %s: %w: the supervisor speaks version %d", op, ErrOutdated, v)
}

func protocolError(op, what string) error {
	return fmt.Errorf("supervisor %s: %w: %s", op, ErrProtocol, what)
}
