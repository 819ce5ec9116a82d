package supervisor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/coder/acp-go-sdk"
	"golang.org/x/sys/unix"

	"github.com/runnerd/runnerd/internal/atomicfile"
	"github.com/runnerd/runnerd/internal/boottime"
	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/wire"
)

// The Agent Client Protocol side of the supervisor (A1–A6). For a
// conversation of that protocol the supervisor is the ACP client: it keeps
// one agent process and one session for the conversation, started and
// initialized by "prepare" before admission, and each turn is one
// session/prompt on it. The session id lives in the state directory
// (ACPSessionFile), out of the agent's reach, and in every retained record
// (Retained.ACPSession).

// ACPSessionFile is the name, in the supervisor's state directory, of the
// conversation's ACP session: its id and whether the agent advertised
// loadSession.
const ACPSessionFile = "acp_session.json"

// acpSessionState is ACPSessionFile's content.
type acpSessionState struct {
	SessionID   string `json:"session_id"`
	LoadSession bool   `json:"load_session"`
}

// Bounds of what the client side of fs/* reads and writes.
const maxACPFileBytes = 4 << 20

// acpAgent is the conversation's ACP agent process, kept across turns.
type acpAgent struct {
	cmd       *exec.Cmd
	pid       int
	conn      *acp.ClientSideConnection
	workspace string
	cred      *syscall.Credential
	exited    chan struct{} // closed once the agent's process is reaped
	result    sandbox.Result
	// loadable: the agent advertised loadSession, so its session can be
	// loaded into a new process. Set before the agent is published
	// (server.acp), read-only after.
	loadable bool

	mu sync.Mutex // guards the fields below
	// session is the session id, set once prepare created or loaded it.
	session acp.SessionId
	// sink is the turn the agent's updates and requests go to; nil
	// between turns and while a kept session is loaded (its replayed
	// history is no turn's events).
	sink *acpSink
	// reaped: the agent's leader is about to be, or was, reaped; no signal
	// goes to its process group id any more but from the reaper.
	reaped bool
	// connLost: the connection ended while the agent ran, and it was
	// stopped for that.
	connLost bool
}

func (ag *acpAgent) alive() bool {
	select {
	case <-ag.exited:
		return false
	default:
		return true
	}
}

// signalKill sends the agent's process group SIGKILL, unless it is being
// reaped (then the reaper kills the group).
func (ag *acpAgent) signalKill() {
	ag.mu.Lock()
	if !ag.reaped {
		_ = unix.Kill(-ag.pid, unix.SIGKILL)
	}
	ag.mu.Unlock()
}

// kill ends the agent's process group, and waits until it is reaped.
func (ag *acpAgent) kill() {
	ag.signalKill()
	<-ag.exited
}

func (ag *acpAgent) setSink(s *acpSink) {
	ag.mu.Lock()
	ag.sink = s
	ag.mu.Unlock()
}

func (ag *acpAgent) currentSink(session acp.SessionId) *acpSink {
	ag.mu.Lock()
	defer ag.mu.Unlock()
	if session != ag.session {
		return nil
	}
	return ag.sink
}

// startACPAgent starts the agent command in the workspace with its stdio as
// the ACP connection. It is reaped by its own goroutine; cleanup runs once
// it is.
func (s *server) startACPAgent(command []string) (*acpAgent, error) {
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("%w: pipe: %v", sandbox.ErrStartFailed, err)
	}
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		stdinR.Close()
		stdinW.Close()
		return nil, fmt.Errorf("%w: pipe: %v", sandbox.ErrStartFailed, err)
	}
	cmd := exec.Command(command[0], command[1:]...)
	cmd.Dir = s.cfg.Workspace
	cmd.Env = s.cfg.AgentEnv
	cmd.Stdin = stdinR
	cmd.Stdout = stdoutW
	cmd.Stderr = s.cfg.AgentStderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: s.cfg.AgentCredential}
	cmd.WaitDelay = s.cfg.DrainTimeout
	s.mu.Lock() // the orphan reaper must not run between fork and record
	err = cmd.Start()
	stdinR.Close()
	stdoutW.Close()
	if err != nil {
		s.mu.Unlock()
		stdinW.Close()
		stdoutR.Close()
		return nil, fmt.Errorf("%w: %v", sandbox.ErrStartFailed, err)
	}
	ag := &acpAgent{cmd: cmd, pid: cmd.Process.Pid, workspace: s.cfg.Workspace, cred: s.cfg.AgentCredential, exited: make(chan struct{})}
	s.acpStarting = ag
	s.mu.Unlock()
	ag.conn = acp.NewClientSideConnection(&acpClient{ag: ag, s: s}, stdinW, stdoutR)
	// The SDK logs a malformed line with its content: agent output never
	// reaches the supervisor's records.
	ag.conn.SetLogger(discardLogger)
	// A connection the SDK gave up on (the agent closed its stdout, or
	// flooded more notifications than its bounded queue holds) cannot
	// carry a turn again: the agent is stopped, and a later turn loads
	// its session into a new process.
	go func() {
		select {
		case <-ag.conn.Done():
		case <-ag.exited:
			return
		}
		select {
		case <-ag.exited: // it closed its stdout by exiting
		case <-time.After(s.cfg.DrainTimeout):
			ag.mu.Lock()
			ag.connLost = true
			ag.mu.Unlock()
			ag.signalKill()
		}
	}()
	go func() {
		var info unix.Siginfo
		for {
			err := unix.Waitid(unix.P_PID, ag.pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
			if !errors.Is(err, unix.EINTR) {
				break
			}
		}
		ag.mu.Lock()
		ag.reaped = true
		ag.mu.Unlock()
		_ = unix.Kill(-ag.pid, unix.SIGKILL)
		waitErr := cmd.Wait()
		ag.result = resultOf(cmd, waitErr)
		stdinW.Close()
		stdoutR.Close()
		close(ag.exited)
		s.mu.Lock()
		if s.acp == ag {
			s.acp = nil
		}
		if s.acpStarting == ag {
			s.acpStarting = nil
		}
		s.reapOrphansLocked()
		s.mu.Unlock()
	}()
	return ag, nil
}

// prepare makes the conversation's ACP agent ready for the activation's
// turn (sandbox.Client.Prepare). Prepares run one at a time.
func (s *server) prepare(req sandbox.Request) (sandbox.Prepared, error) {
	if req.Protocol != sandbox.AgentProtocolACP {
		return sandbox.Prepared{}, fmt.Errorf("%w: prepare is for protocol %q", sandbox.ErrProtocol, sandbox.AgentProtocolACP)
	}
	if len(req.Command) == 0 || req.Command[0] == "" {
		return sandbox.Prepared{}, fmt.Errorf("%w: empty agent command", sandbox.ErrProtocol)
	}
	s.prepareMu.Lock()
	defer s.prepareMu.Unlock()
	s.mu.Lock()
	a, err := s.lookup(req.Activation)
	if err == nil && a.state != actIdle {
		err = sandbox.ErrAlreadyRun
	}
	if err == nil && s.running != nil {
		err = sandbox.ErrBusy
	}
	ag := s.acp
	nativeTurn := s.nativeTurn
	s.mu.Unlock()
	if err != nil {
		return sandbox.Prepared{}, err
	}
	if ag != nil && ag.alive() {
		return sandbox.Prepared{PID: ag.pid}, nil
	}
	kept, err := loadACPSession(s.cfg.StateDir)
	if err != nil {
		recordStateFailure(s.log, "acp_session_load")
		return sandbox.Prepared{}, fmt.Errorf("%w: %v", sandbox.ErrStartFailed, err)
	}
	if kept == nil && nativeTurn > 0 {
		// Turns ran, and no session is kept: a new one would forget them.
		recordACPNotLoadable(s.log, "no_session_kept")
		return sandbox.Prepared{}, fmt.Errorf("%w: no session id is kept for native turn %d", sandbox.ErrSessionNotLoadable, nativeTurn)
	}
	ag, err = s.startACPAgent(req.Command)
	if err != nil {
		return sandbox.Prepared{}, err
	}
	fail := func(err error) (sandbox.Prepared, error) {
		ag.kill()
		return sandbox.Prepared{}, err
	}
	// Each call has its own bound; ctx is the current one's.
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ACPTimeout)
	defer func() { cancel() }()
	next := func() {
		cancel()
		ctx, cancel = context.WithTimeout(context.Background(), s.cfg.ACPTimeout)
	}
	// A call ends when the agent exits, too: its stdout closes.
	unresponsive := func(call string, err error) error {
		if ctx.Err() == nil {
			// The call failed before its bound: the agent closed its
			// stdout, most likely by exiting; see whether it did.
			select {
			case <-ag.exited:
				return fmt.Errorf("%w: the agent exited during %s (exit code %d%s)", sandbox.ErrStartFailed, call, ag.result.ExitCode, signalNote(ag.result))
			case <-time.After(s.cfg.DrainTimeout):
			}
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w: no answer to %s within %s", sandbox.ErrAgentUnresponsive, call, s.cfg.ACPTimeout)
		}
		return fmt.Errorf("%w: %s: %v", sandbox.ErrStartFailed, call, err)
	}
	init, err := ag.conn.Initialize(ctx, acp.InitializeRequest{
		ProtocolVersion: acp.ProtocolVersionNumber,
		// Only what is served: fs inside the workspace; no terminal.
		ClientCapabilities: acp.ClientCapabilities{Fs: acp.FileSystemCapabilities{ReadTextFile: true, WriteTextFile: true}},
		ClientInfo:         &acp.Implementation{Name: "runnerd", Version: strconv.Itoa(sandbox.ProtocolVersion)},
	})
	if err != nil {
		return fail(unresponsive("initialize", err))
	}
	out := sandbox.Prepared{PID: ag.pid, Started: true}
	next()
	var sid acp.SessionId
	if kept != nil {
		if !init.AgentCapabilities.LoadSession {
			recordACPNotLoadable(s.log, "no_load_session")
			return fail(fmt.Errorf("%w: the agent does not advertise loadSession", sandbox.ErrSessionNotLoadable))
		}
		sid = acp.SessionId(kept.SessionID)
		ag.mu.Lock()
		ag.session = sid // no sink: the replayed history is not re-emitted
		ag.mu.Unlock()
		if _, err := ag.conn.LoadSession(ctx, acp.LoadSessionRequest{SessionId: sid, Cwd: s.cfg.Workspace, McpServers: []acp.McpServer{}}); err != nil {
			if e := unresponsive("session/load", err); !errors.Is(e, sandbox.ErrStartFailed) {
				return fail(e)
			}
			recordACPNotLoadable(s.log, "load_refused")
			return fail(fmt.Errorf("%w: session/load: %v", sandbox.ErrSessionNotLoadable, err))
		}
		out.Loaded = true
	} else {
		resp, err := ag.conn.NewSession(ctx, acp.NewSessionRequest{Cwd: s.cfg.Workspace, McpServers: []acp.McpServer{}})
		if err != nil {
			return fail(unresponsive("session/new", err))
		}
		if resp.SessionId == "" {
			return fail(fmt.Errorf("%w: session/new answered no session id", sandbox.ErrStartFailed))
		}
		sid = resp.SessionId
		b, _ := json.Marshal(acpSessionState{SessionID: string(sid), LoadSession: init.AgentCapabilities.LoadSession})
		// Durable before any prompt can reach the session.
		if err := atomicfile.Write(filepath.Join(s.cfg.StateDir, ACPSessionFile), append(b, '\n'), 0o600); err != nil {
			recordStateFailure(s.log, "acp_session_store")
			return fail(fmt.Errorf("%w: record the session: %v", sandbox.ErrStartFailed, err))
		}
		ag.mu.Lock()
		ag.session = sid
		ag.mu.Unlock()
	}
	ag.loadable = init.AgentCapabilities.LoadSession
	s.mu.Lock()
	s.acp = ag
	s.acpSession = string(sid)
	s.mu.Unlock()
	recordACPPrepared(s.log, ag.pid, out.Loaded, init.AgentCapabilities.LoadSession)
	return out, nil
}

func signalNote(r sandbox.Result) string {
	if r.Signal == "" {
		return ""
	}
	return ", signal " + r.Signal
}

// loadACPSession reads ACPSessionFile; nil if there is none.
func loadACPSession(dir string) (*acpSessionState, error) {
	b, err := os.ReadFile(filepath.Join(dir, ACPSessionFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the ACP session: %w", err)
	}
	var st acpSessionState
	if err := json.Unmarshal(b, &st); err != nil || st.SessionID == "" {
		return nil, fmt.Errorf("the ACP session file is corrupt")
	}
	return &st, nil
}

// runACP serves an ACP "run": one session/prompt with the turn's prompt
// to the agent prepare made ready, its session/updates streamed as events
// in order, and its stop reason in the result. The agent outlives the
// turn unless the turn is stopped (dropped, fenced, deadline, shutdown, a
// cancel unanswered within its grace): then it is killed, and the next
// turn loads the session again.
func (s *server) runACP(conn net.Conn, req sandbox.Request) {
	a, t, ag, err := s.startACPTurn(conn, req)
	if err != nil {
		recordRefused(s.log, sandbox.OpRun, sandbox.CodeOf(err))
		_ = writeMsg(conn, errReply(err))
		return
	}
	recordTurnStarted(s.log, a.gen, ag.pid)
	timeout := time.Duration(req.PermissionTimeoutMS) * time.Millisecond
	if timeout <= 0 {
		timeout = sandbox.DefaultPermissionTimeout
	}
	sink := &acpSink{conn: conn, ok: true, policy: req.PermissionPolicy, timeout: timeout, drop: func() { t.stop(stopDropped) },
		pending: map[string]chan string{}, cancelled: make(chan struct{})}
	t.acpCancel = func() {
		sink.cancel()
		go func() { _ = ag.conn.Cancel(context.Background(), acp.CancelNotification{SessionId: ag.session}) }()
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { s.fence(a, t) })
	// The driving connection carries the owner's answers; its close stops
	// the turn.
	wg.Go(func() {
		sink.readAnswers(conn)
		t.stop(stopDropped)
	})
	defer conn.Close()

	pctx, endPrompt := context.WithCancel(context.Background())
	defer endPrompt()
	sink.write(sandbox.Response{Started: &sandbox.Started{PID: ag.pid}})
	ag.setSink(sink)
	recordACPPromptSent(s.log, s.instance, a.gen, ag.pid)
	resp, perr := ag.conn.Prompt(pctx, acp.PromptRequest{SessionId: ag.session, Prompt: []acp.ContentBlock{acp.TextBlock(req.Prompt)}})
	ag.setSink(nil)
	sink.cancel() // a permission request still waiting is answered cancelled
	why := t.end()
	if why != stopNone && why != stopInterrupt {
		ag.kill() // t.stop killed it; nothing of the turn runs once it is reaped
	}
	// The turn is over at the agent: answered, failed, or the agent reaped.
	recordACPPromptEnded(s.log, s.instance, a.gen, ag.pid, string(resp.StopReason), perr != nil)
	var res sandbox.Result
	if perr != nil && (why == stopNone || why == stopInterrupt) {
		// A JSON-RPC error leaves the connection up; an exit, or a
		// connection the SDK gave up on, ends it, and then the agent is
		// reaped within the drain timeout (it is killed if it lingers).
		var answered <-chan time.Time
		select {
		case <-ag.conn.Done():
		default:
			answered = time.After(s.cfg.DrainTimeout)
		}
		select {
		case <-ag.exited:
			res = ag.result
			res.Failure = sandbox.FailureACPAgentExit
			ag.mu.Lock()
			if ag.connLost && res.Signal == "SIGKILL" {
				res.Failure = sandbox.FailureACPConnection
			}
			ag.mu.Unlock()
		case <-answered:
			res.Failure = sandbox.FailureACPError
		}
	} else if perr == nil {
		res.StopReason = string(resp.StopReason)
	}

	s.mu.Lock()
	// The agent ended the turn itself (or died doing it): the prompt
	// reached it and nothing of the turn runs any more.
	s.endTurnLocked(a, &res, why, s.nativeTurn+1, s.nativeTurn)
	s.mu.Unlock()
	close(t.done)

	if why == stopNone {
		recordTurnEnded(s.log, a.gen, res)
		sink.write(sandbox.Response{End: &res})
		return
	}
	recordTurnStopped(s.log, a.gen, why.String())
	err = fmt.Errorf("%w: %s", sandbox.ErrInterrupted, why)
	switch why {
	case stopFenced:
		err = sandbox.ErrFenced
	case stopDeadline:
		err = sandbox.ErrDeadlinePassed
	case stopInterrupt:
		err = fmt.Errorf("%w: on request; settle for the interrupted boundary", sandbox.ErrInterrupted)
	}
	sink.write(errReply(err))
}

// startACPTurn checks the token, spends the activation and records the
// turn, under the lock, as start does for the line protocol. The agent
// must be the one prepare made ready.
func (s *server) startACPTurn(conn net.Conn, req sandbox.Request) (*activation, *agentTurn, *acpAgent, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, err := s.lookup(req.Activation)
	if err != nil {
		return nil, nil, nil, err
	}
	if a.state != actIdle {
		return nil, nil, nil, sandbox.ErrAlreadyRun
	}
	if !a.leaseDeadline.IsZero() && !boottime.Now().Before(a.leaseDeadline) {
		return nil, nil, nil, sandbox.ErrDeadlinePassed
	}
	if s.running != nil {
		return nil, nil, nil, sandbox.ErrBusy
	}
	// Spent from here on, whatever happens next: one prompt per activation.
	a.state = actStartFailed
	ag := s.acp
	if ag == nil || !ag.alive() {
		return nil, nil, nil, fmt.Errorf("%w: the agent is not running (prepare comes first)", sandbox.ErrStartFailed)
	}
	// Recorded before the prompt can reach the agent (K13), as start does.
	prev := s.retained
	if err := s.retain(&sandbox.Retained{Activation: a.id, NativeTurn: s.nativeTurn, Ended: sandbox.EndedUnfinished}); err != nil {
		s.retained = prev
		return nil, nil, nil, fmt.Errorf("%w: record the turn: %v", sandbox.ErrStartFailed, err)
	}
	t := &agentTurn{cancel: ag.signalKill, done: make(chan struct{}), conn: conn, grace: s.cfg.DrainTimeout, moved: make(chan struct{}, 1), pid: ag.pid}
	a.state = actRunning
	a.turn = t
	s.running = t
	return a, t, ag, nil
}

// acpSink is a running ACP turn as its agent's updates and requests see
// it: the driving connection and the permission policy.
type acpSink struct {
	policy  string
	timeout time.Duration
	drop    func() // stops the turn when the driving connection fails

	wmu  sync.Mutex // guards conn's writes, seq and ok
	conn net.Conn
	seq  int64
	ok   bool

	pmu       sync.Mutex // guards pending, nextID and done
	pending   map[string]chan string
	nextID    int
	done      bool
	cancelled chan struct{} // closed by cancel
}

func (k *acpSink) write(resp sandbox.Response) {
	k.wmu.Lock()
	defer k.wmu.Unlock()
	if !k.ok {
		return
	}
	if resp.Event != nil {
		k.seq++
		resp.Event.Seq = k.seq
	}
	if writeMsg(k.conn, resp) != nil {
		k.ok = false
		go k.drop()
	}
}

// event emits one job event of type typ with data, bounded: data over
// sandbox.MaxEventBytes is replaced by a note saying so, with its head.
func (k *acpSink) event(typ string, data []byte) {
	data, _ = bounded(data, sandbox.MaxEventBytes)
	k.write(sandbox.Response{Event: &sandbox.Event{Time: time.Now().UTC(), Type: typ, Data: data}})
}

// bounded is data if it is at most limit bytes, else a note of at most
// limit bytes saying it was truncated, its size, and as much of its head
// as fits once quoted (quoting can make the head several times longer).
func bounded(data []byte, limit int) ([]byte, bool) {
	if len(data) <= limit {
		return data, false
	}
	for n := limit / 2; ; n /= 2 {
		b, _ := json.Marshal(map[string]any{"truncated": true, "bytes": len(data), "head": string(data[:n])})
		if len(b) <= limit {
			return b, true
		}
	}
}

// permissionRequested is the data of a permission_requested event, within
// the event bound. Over it, the tool call is truncated (and says so) while
// request_id, options and policy stay whole, so the owner can still answer;
// answerable is false only if even those do not fit.
func permissionRequested(id string, p acp.RequestPermissionRequest, policy string) (data []byte, answerable bool) {
	full, _ := json.Marshal(map[string]any{"request_id": id, "tool_call": p.ToolCall, "options": p.Options, "policy": policy})
	if len(full) <= sandbox.MaxEventBytes {
		return full, true
	}
	tc, _ := json.Marshal(p.ToolCall)
	tc, _ = bounded(tc, sandbox.MaxEventBytes/2)
	b, _ := json.Marshal(map[string]any{"request_id": id, "tool_call": json.RawMessage(tc), "options": p.Options, "policy": policy,
		"truncated": true, "bytes": len(full)})
	if len(b) <= sandbox.MaxEventBytes {
		return b, true
	}
	b, _ = bounded(full, sandbox.MaxEventBytes)
	return b, false
}

// cancel answers every waiting permission request cancelled, and every
// later one: the turn is being cancelled or is over.
func (k *acpSink) cancel() {
	k.pmu.Lock()
	defer k.pmu.Unlock()
	if !k.done {
		k.done = true
		close(k.cancelled)
	}
}

// readAnswers reads the owner's permission answers from the driving
// connection until it closes or says something else.
func (k *acpSink) readAnswers(conn net.Conn) {
	br := bufio.NewReaderSize(conn, 4<<10)
	for {
		line, err := sandbox.ReadLine(br, 4<<10)
		if err != nil {
			return
		}
		var req sandbox.Request
		if json.Unmarshal(line, &req) != nil || req.Op != sandbox.OpAnswer {
			return
		}
		k.pmu.Lock()
		if ch, ok := k.pending[req.RequestID]; ok {
			select {
			case ch <- req.OptionID:
			default: // answers beyond the buffer, unread, are dropped
			}
		}
		k.pmu.Unlock()
	}
}

// permission answers one session/request_permission by the policy.
func (k *acpSink) permission(ctx context.Context, p acp.RequestPermissionRequest) acp.RequestPermissionResponse {
	cancelled := acp.RequestPermissionResponse{Outcome: acp.NewRequestPermissionOutcomeCancelled()}
	k.pmu.Lock()
	k.nextID++
	id := "perm-" + strconv.Itoa(k.nextID)
	ch := make(chan string, 8)
	if !k.done {
		k.pending[id] = ch
	}
	done := k.done
	k.pmu.Unlock()
	defer func() {
		k.pmu.Lock()
		delete(k.pending, id)
		k.pmu.Unlock()
	}()
	req, answerable := permissionRequested(id, p, k.policy)
	k.event(EventPermissionRequested, req)
	answer := func(option acp.PermissionOptionId, by string) acp.RequestPermissionResponse {
		b, _ := json.Marshal(map[string]any{"request_id": id, "option_id": option, "by": by})
		k.event(EventPermissionAnswered, b)
		return acp.RequestPermissionResponse{Outcome: acp.NewRequestPermissionOutcomeSelected(option)}
	}
	answerCancelled := func(why string) acp.RequestPermissionResponse {
		b, _ := json.Marshal(map[string]any{"request_id": id, "outcome": "cancelled", "by": why})
		k.event(EventPermissionAnswered, b)
		return cancelled
	}
	if done {
		return answerCancelled("turn_over")
	}
	pick := func(kinds ...acp.PermissionOptionKind) (acp.PermissionOptionId, bool) {
		for _, o := range p.Options {
			for _, kind := range kinds {
				if o.Kind == kind {
					return o.OptionId, true
				}
			}
		}
		return "", false
	}
	switch k.policy {
	case wire.PermissionAllow:
		if o, ok := pick(acp.PermissionOptionKindAllowOnce, acp.PermissionOptionKindAllowAlways); ok {
			return answer(o, "policy")
		}
		return answerCancelled("no_allow_option")
	case wire.PermissionReject:
		if o, ok := pick(acp.PermissionOptionKindRejectOnce, acp.PermissionOptionKindRejectAlways); ok {
			return answer(o, "policy")
		}
		return answerCancelled("no_reject_option")
	}
	if !answerable {
		// The owner could not see its options: nobody can answer it.
		return answerCancelled("too_large")
	}
	timer := time.NewTimer(k.timeout)
	defer timer.Stop()
	for {
		select {
		case o := <-ch:
			for _, opt := range p.Options {
				if string(opt.OptionId) == o {
					return answer(opt.OptionId, "owner")
				}
			}
			// Not one of its options: keep waiting for a valid one.
		case <-timer.C:
			return answerCancelled("timeout")
		case <-k.cancelled:
			return answerCancelled("cancel")
		case <-ctx.Done():
			return answerCancelled("agent_withdrew")
		}
	}
}

// Event types an ACP turn emits beside the agent's own update kinds.
const (
	EventPermissionRequested = wire.EventPermissionRequested
	EventPermissionAnswered  = wire.EventPermissionAnswered
)

// acpClient is the client side of the agent's connection: what the agent
// may ask of the supervisor.
type acpClient struct {
	ag *acpAgent
	s  *server
}

var _ acp.Client = (*acpClient)(nil)

// SessionUpdate emits one job event per update, of the update's kind, in
// the order the agent sent them (the SDK handles notifications one at a
// time, in order). Updates outside a turn (a loaded session's replay, a
// late one) are no turn's events.
func (c *acpClient) SessionUpdate(_ context.Context, n acp.SessionNotification) error {
	sink := c.ag.currentSink(n.SessionId)
	if sink == nil {
		return nil
	}
	data, err := json.Marshal(n.Update)
	if err != nil {
		return nil
	}
	var head struct {
		Kind string `json:"sessionUpdate"`
	}
	_ = json.Unmarshal(data, &head)
	if head.Kind == "" {
		head.Kind = "session_update"
	}
	sink.event(head.Kind, data)
	return nil
}

func (c *acpClient) RequestPermission(ctx context.Context, p acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
	sink := c.ag.currentSink(p.SessionId)
	if sink == nil {
		return acp.RequestPermissionResponse{Outcome: acp.NewRequestPermissionOutcomeCancelled()}, nil
	}
	return sink.permission(ctx, p), nil
}

// ReadTextFile reads a file inside the workspace only.
func (c *acpClient) ReadTextFile(_ context.Context, p acp.ReadTextFileRequest) (acp.ReadTextFileResponse, error) {
	f, err := openInWorkspace(c.ag.workspace, p.Path, unix.O_RDONLY, 0)
	if err != nil {
		return acp.ReadTextFileResponse{}, err
	}
	defer f.Close()
	b, err := readBounded(f)
	if err != nil {
		return acp.ReadTextFileResponse{}, acp.NewInternalError(map[string]any{"error": err.Error()})
	}
	return acp.ReadTextFileResponse{Content: sliceLines(string(b), p.Line, p.Limit)}, nil
}

// WriteTextFile writes a file inside the workspace only, durably (the file
// and its directory synced) before it answers.
func (c *acpClient) WriteTextFile(_ context.Context, p acp.WriteTextFileRequest) (acp.WriteTextFileResponse, error) {
	if len(p.Content) > maxACPFileBytes {
		return acp.WriteTextFileResponse{}, acp.NewInvalidParams(map[string]any{"error": "content over the size limit"})
	}
	f, err := openInWorkspace(c.ag.workspace, p.Path, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, 0o644)
	if err != nil {
		return acp.WriteTextFileResponse{}, err
	}
	defer f.Close()
	if c.ag.cred != nil {
		_ = f.Chown(int(c.ag.cred.Uid), int(c.ag.cred.Gid))
	}
	if _, err := f.WriteString(p.Content); err != nil {
		return acp.WriteTextFileResponse{}, acp.NewInternalError(map[string]any{"error": "write failed"})
	}
	if err := f.Sync(); err != nil {
		return acp.WriteTextFileResponse{}, acp.NewInternalError(map[string]any{"error": "sync failed"})
	}
	dir, err := openInWorkspace(c.ag.workspace, filepath.Dir(filepath.Clean(p.Path)), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err == nil {
		err = dir.Sync()
		dir.Close()
	}
	if err != nil {
		return acp.WriteTextFileResponse{}, acp.NewInternalError(map[string]any{"error": "sync of the directory failed"})
	}
	return acp.WriteTextFileResponse{}, nil
}

// The terminal is not served (the client does not declare it).
func (c *acpClient) CreateTerminal(context.Context, acp.CreateTerminalRequest) (acp.CreateTerminalResponse, error) {
	return acp.CreateTerminalResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalCreate)
}

func (c *acpClient) KillTerminal(context.Context, acp.KillTerminalRequest) (acp.KillTerminalResponse, error) {
	return acp.KillTerminalResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalKill)
}

func (c *acpClient) TerminalOutput(context.Context, acp.TerminalOutputRequest) (acp.TerminalOutputResponse, error) {
	return acp.TerminalOutputResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalOutput)
}

func (c *acpClient) ReleaseTerminal(context.Context, acp.ReleaseTerminalRequest) (acp.ReleaseTerminalResponse, error) {
	return acp.ReleaseTerminalResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalRelease)
}

func (c *acpClient) WaitForTerminalExit(context.Context, acp.WaitForTerminalExitRequest) (acp.WaitForTerminalExitResponse, error) {
	return acp.WaitForTerminalExitResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalWaitForExit)
}

// openInWorkspace opens path, which must be absolute and inside the
// workspace, resolving it beneath the workspace (openat2 RESOLVE_BENEATH):
// "..", another absolute path and a symlink leading out are refused by
// the kernel at the moment of the open, whatever the agent does to the
// tree meanwhile. A refusal is a JSON-RPC error naming no content.
func openInWorkspace(workspace, path string, flags int, mode uint32) (*os.File, error) {
	if !filepath.IsAbs(path) {
		return nil, acp.NewInvalidParams(map[string]any{"error": "the path must be absolute"})
	}
	ws := filepath.Clean(workspace)
	if abs, err := filepath.Abs(ws); err == nil {
		ws = abs
	}
	rel, err := filepath.Rel(ws, filepath.Clean(path))
	if err != nil || !within(path, ws) {
		return nil, acp.NewInvalidParams(map[string]any{"error": "the path is outside the workspace"})
	}
	root, err := unix.Open(ws, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, acp.NewInternalError(map[string]any{"error": "the workspace cannot be opened"})
	}
	defer unix.Close(root)
	fd, err := unix.Openat2(root, rel, &unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC | unix.O_NOCTTY),
		Mode:    uint64(mode),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
	})
	switch {
	case errors.Is(err, unix.EXDEV):
		return nil, acp.NewInvalidParams(map[string]any{"error": "the path leads outside the workspace"})
	case errors.Is(err, unix.ENOENT):
		return nil, &acp.RequestError{Code: -32002, Message: "Resource not found", Data: map[string]any{"error": "no such file in the workspace"}}
	case err != nil:
		return nil, acp.NewInvalidParams(map[string]any{"error": "the path cannot be opened: " + unix.ErrnoName(err.(unix.Errno))})
	}
	return os.NewFile(uintptr(fd), path), nil
}

func readBounded(f *os.File) ([]byte, error) {
	b := make([]byte, 0, 64<<10)
	for {
		if len(b) == cap(b) {
			if len(b) > maxACPFileBytes {
				return nil, fmt.Errorf("the file is over %d bytes", maxACPFileBytes)
			}
			b = append(b, 0)[:len(b)]
		}
		n, err := f.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil {
			if len(b) > maxACPFileBytes {
				return nil, fmt.Errorf("the file is over %d bytes", maxACPFileBytes)
			}
			return b, nil
		}
	}
}

// sliceLines is content from line (1-based) for limit lines, as
// fs/read_text_file asks.
func sliceLines(content string, line, limit *int) string {
	if line == nil && limit == nil {
		return content
	}
	start := 0
	if line != nil && *line > 1 {
		for i, n := 0, 1; i < len(content); i++ {
			if content[i] == '\n' {
				n++
				if n == *line {
					start = i + 1
					break
				}
			}
			if i == len(content)-1 {
				return ""
			}
		}
	}
	rest := content[start:]
	if limit == nil {
		return rest
	}
	end, n := len(rest), 0
	for i := 0; i < len(rest); i++ {
		if rest[i] == '\n' {
			n++
			if n == *limit {
				end = i + 1
				break
			}
		}
	}
	if *limit <= 0 {
		end = 0
	}
	return rest[:end]
}
