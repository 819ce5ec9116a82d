package supervisor

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/runnerd/runnerd/internal/boottime"
	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/internal/pidfd"
)

// Why a turn was stopped before the agent ended on its own.
type stopReason int

const (
	stopNone      stopReason = iota
	stopDropped              // the driving connection closed
	stopFenced               // a newer activation took ownership
	stopShutdown             // the supervisor is stopping
	stopDeadline             // the activation's lease deadline passed (K5)
	stopInterrupt            // interrupted on request (K10): the one stop that settles
	// stopCancelUnanswered: an ACP agent did not end its turn within the
	// grace after session/cancel, and was killed (A3).
	stopCancelUnanswered
)

func (r stopReason) String() string {
	switch r {
	case stopDropped:
		return "connection_dropped"
	case stopFenced:
		return "fenced"
	case stopShutdown:
		return "shutdown"
	case stopDeadline:
		return "lease_deadline"
	case stopInterrupt:
		return "interrupted_on_request"
	case stopCancelUnanswered:
		return "cancel_unanswered"
	}
	return "none"
}

// agentTurn is the one agent process of a running turn.
type agentTurn struct {
	cancel context.CancelFunc // kills the agent's process group
	done   chan struct{}      // closed once the agent is reaped and the turn recorded
	conn   net.Conn           // the driving connection
	grace  time.Duration      // how long a stopped turn may still write to it
	moved  chan struct{}      // one pending notice that the lease deadline moved
	pid    int                // the agent's pid, also its process group id
	// acpCancel, on an ACP turn, is how it is interrupted on request:
	// session/cancel instead of SIGINT. Set before the turn can be
	// interrupted.
	acpCancel func()

	mu     sync.Mutex // guards reason, reaped, over, held and stoppedAt
	reason stopReason
	// held: the agent and every process descending from it when the turn
	// was first stopped (stoppedAt), each by a pidfd, for the proof that
	// they are gone (S6); nil on a turn not stopped, or one whose
	// processes could not be held.
	held      *pidfd.Held
	stoppedAt time.Time
	// over: the ACP turn ended (end); a stop from then on is no stop of
	// it, and must not kill the agent the conversation keeps.
	over bool
	// reaped is set before the agent's leader is reaped: from then on its
	// process group id may be reused, and no signal goes to it but from
	// the reaper, which kills the group first.
	reaped bool
}

// interrupt asks the agent to stop (SIGINT to its process group) for
// reason stopInterrupt, unless the turn is already stopping for another.
func (t *agentTurn) interrupt() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.reason != stopNone {
		return
	}
	t.reason = stopInterrupt
	t.holdLocked()
	if t.acpCancel != nil {
		t.acpCancel()
		return
	}
	if !t.reaped {
		_ = unix.Kill(-t.pid, unix.SIGINT)
	}
}

// cancelUnanswered: an ACP turn's session/cancel was not answered within
// its grace; the kill that follows leaves it interrupted, not settled.
func (t *agentTurn) cancelUnanswered() {
	t.mu.Lock()
	if t.reason == stopInterrupt {
		t.reason = stopCancelUnanswered
	}
	t.mu.Unlock()
	t.stop(stopCancelUnanswered)
}

func (t *agentTurn) deadlineMoved() {
	select {
	case t.moved <- struct{}{}:
	default:
	}
}

// fence stops the turn when its activation's lease deadline passes on
// CLOCK_BOOTTIME, whatever the driving connection does: a frozen turn child
// keeps it open (K5). It returns when the turn is over.
func (s *server) fence(a *activation, t *agentTurn) {
	alarm, err := boottime.NewAlarm()
	if err != nil {
		recordStateFailure(s.log, "deadline_alarm")
		t.stop(stopDeadline) // a turn we cannot fence does not run
		return
	}
	defer alarm.Close()
	for {
		s.mu.Lock()
		at := a.leaseDeadline
		s.mu.Unlock()
		if !at.IsZero() {
			if !boottime.Now().Before(at) {
				t.stop(stopDeadline)
				return
			}
			if err := alarm.Set(at); err != nil {
				recordStateFailure(s.log, "deadline_alarm")
				t.stop(stopDeadline)
				return
			}
		}
		select {
		case <-alarm.C():
		case <-t.moved:
		case <-t.done:
			return
		}
	}
}

// holdLocked holds the agent's tree as the turn is first stopped: before
// any signal of the stop, so whatever of it leaves the agent's process
// group or session is still held. Called with t.mu held.
func (t *agentTurn) holdLocked() {
	if t.held != nil || t.reaped || t.acpCancel != nil {
		return // an ACP agent outlives its turns: not held here
	}
	if h, err := pidfd.HoldTree(t.pid); err == nil {
		t.held, t.stoppedAt = h, time.Now()
	}
}

// proveGone waits, until budget after the stop, for every process held
// when the turn was stopped, and names those still running (S6). A lines
// turn calls it once its agent is reaped and its process group killed.
func (t *agentTurn) proveGone(budget time.Duration) (agent int, running []int) {
	t.mu.Lock()
	held, at := t.held, t.stoppedAt
	t.held = nil
	t.mu.Unlock()
	if held == nil {
		return t.pid, nil
	}
	return t.pid, held.Wait(at.Add(budget))
}

func (t *agentTurn) stop(why stopReason) {
	t.mu.Lock()
	if t.reason == stopNone && !t.over {
		t.reason = why
		t.holdLocked()
	}
	over := t.over
	t.mu.Unlock()
	if !over {
		t.cancel()
	}
	// A driver that stopped reading must not hold up whoever stops the
	// turn (a newer activation waits for it): writes to it end after grace.
	_ = t.conn.SetWriteDeadline(time.Now().Add(t.grace))
}

// end marks an ACP turn over and returns why it was stopped, if it was.
func (t *agentTurn) end() stopReason {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.over = true
	return t.reason
}

func (t *agentTurn) stopReason() stopReason {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.reason
}

// run serves one "run" request on its driving connection: it starts the
// agent with the prompt on stdin, streams its stdout lines as events and
// ends with the result. The connection closing stops the agent.
func (s *server) run(ctx context.Context, conn net.Conn, req sandbox.Request) {
	if req.Protocol == sandbox.AgentProtocolACP {
		s.runACP(conn, req)
		return
	}
	if req.Protocol != "" {
		_ = writeMsg(conn, errReply(fmt.Errorf("%w: unknown agent protocol", sandbox.ErrProtocol)))
		return
	}
	if len(req.Command) == 0 || req.Command[0] == "" {
		_ = writeMsg(conn, errReply(fmt.Errorf("%w: empty agent command", sandbox.ErrProtocol)))
		return
	}
	before := readCounters() // the sandbox's counters before the agent runs (S5)
	a, t, cmd, stdout, stdin, err := s.start(ctx, conn, req)
	if err != nil {
		recordRefused(s.log, sandbox.OpRun, sandbox.CodeOf(err))
		_ = writeMsg(conn, errReply(err))
		return
	}
	recordAgentStarted(s.log, s.instance, a.gen, cmd.Process.Pid)
	recordTurnStarted(s.log, a.gen, cmd.Process.Pid)

	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { s.fence(a, t) })
	// The prompt, once. A hanging agent that never reads it holds this
	// writer until the agent is killed, which breaks the pipe.
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = io.WriteString(stdin, req.Prompt)
		stdin.Close()
	}()
	// The driving connection: the client sends nothing after its request,
	// so a read returns only when the connection closes.
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = io.Copy(io.Discard, conn)
		t.stop(stopDropped)
	}()
	defer conn.Close() // ends the watcher above once the turn is over
	// Reap: see the exit without reaping (WNOWAIT) so the leader's pid, and
	// with it the process group id, cannot be reused while the group is
	// killed; then reap. The kill takes any descendant still holding stdout.
	var waitErr error
	waited := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(waited)
		var info unix.Siginfo
		for {
			err := unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
			if !errors.Is(err, unix.EINTR) {
				break
			}
		}
		recordAgentExited(s.log, s.instance, a.gen, cmd.Process.Pid) // exited, not yet reaped: the pid is still its
		t.mu.Lock()
		t.reaped = true
		t.mu.Unlock()
		_ = unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
		waitErr = cmd.Wait()
		_ = stdout.SetReadDeadline(time.Now().Add(s.cfg.DrainTimeout))
	}()

	connOK := writeMsg(conn, sandbox.Response{Started: &sandbox.Started{PID: cmd.Process.Pid}}) == nil
	if !connOK {
		t.stop(stopDropped)
	}
	br := bufio.NewReaderSize(stdout, 64<<10)
	var seq, reported int64
	for {
		line, truncated, err := readAgentLine(br, sandbox.MaxEventBytes)
		if len(line) > 0 || truncated {
			seq++
			ev, nt := makeEvent(seq, line, truncated)
			if nt > 0 {
				reported = nt
			}
			if connOK && writeMsg(conn, sandbox.Response{Event: &ev}) != nil {
				connOK = false
				t.stop(stopDropped)
			}
		}
		if err != nil {
			break
		}
	}
	<-waited
	t.cancel()
	stdout.Close()

	res := resultOf(cmd, waitErr)
	why := t.stopReason()
	if why == stopNone {
		res.Cause, res.CauseEvidence = causeOf(res, before, readCounters(), []string{s.cfg.Workspace, os.TempDir()})
	}
	s.mu.Lock()
	// The agent said how far its session got, if it did; keep that, on a
	// turn it ended or one stopped without a receipt alike.
	settled, unsettled := s.nativeTurn+1, s.nativeTurn
	if reported > 0 {
		settled, unsettled = reported, reported
	}
	s.endTurnLocked(a, &res, why, settled, unsettled)
	s.reapOrphansLocked()
	s.mu.Unlock()
	close(t.done)

	if why == stopNone {
		recordTurnEnded(s.log, a.gen, res)
		if connOK {
			_ = writeMsg(conn, sandbox.Response{End: &res})
		}
		return
	}
	recordTurnStopped(s.log, a.gen, why.String())
	if connOK {
		err := fmt.Errorf("%w: %s", sandbox.ErrInterrupted, why)
		switch why {
		case stopFenced:
			err = sandbox.ErrFenced
		case stopDeadline:
			err = sandbox.ErrDeadlinePassed
		case stopInterrupt:
			err = fmt.Errorf("%w: on request; settle for the interrupted boundary", sandbox.ErrInterrupted)
		}
		_ = writeMsg(conn, errReply(err))
	}
	// The driver has its answer and a newer activation its turn (t.done):
	// the proof waits for no one.
	if agent, left := t.proveGone(s.cfg.TeardownBudget); len(left) > 0 {
		// For the daemon too, whose metric counts it when it collects the
		// file (sandbox.CollectTeardownRecords): on disk before the record.
		rec := sandbox.TeardownRecord{Teardown: teardownOf(why), Generation: a.gen, AgentPID: agent, PIDs: left,
			BudgetMS: s.cfg.TeardownBudget.Milliseconds(), At: time.Now()}
		if err := sandbox.WriteTeardownRecord(s.cfg.StateDir, rec); err != nil {
			recordFailed(s.log, "teardown_record_unwritable")
		}
		recordTeardownIncomplete(s.log, a.gen, teardownOf(why), agent, left, s.cfg.TeardownBudget)
	}
}

// teardownOf names the teardown a stop is (S6): a cancel (interrupted on
// request, or an ACP cancel unanswered), a fence (a newer activation, or
// the lease deadline), or the stop's own reason.
func teardownOf(why stopReason) string {
	switch why {
	case stopInterrupt, stopCancelUnanswered:
		return "cancel"
	case stopFenced, stopDeadline:
		return "fence"
	}
	return why.String()
}

// endTurnLocked records how activation a's turn ended, by either protocol.
// Ended on its own, or interrupted on request: either way the prompt
// reached the agent and nothing of the turn runs any more, so the native
// session moved on by this turn, to settled (K10), and res is the result to
// settle. Stopped any other way, it has no receipt: the record keeps the
// stop reason at unsettled. Called with s.mu held.
func (s *server) endTurnLocked(a *activation, res *sandbox.Result, why stopReason, settled, unsettled int64) {
	if why == stopNone || why == stopInterrupt {
		res.NativeTurn = settled
		a.state = actCompleted
		ended := sandbox.EndedCompleted
		if why == stopInterrupt {
			a.state = actInterruptSettled
			ended = sandbox.EndedInterruptSettled
		}
		a.result = *res
		s.retainTurn(a, settled, ended)
	} else {
		s.retainTurn(a, unsettled, why.String())
		a.state = actInterrupted
	}
	s.running = nil
}

// start checks the token, spends the activation and starts the agent, all
// under the lock so that an activation cannot slip between the check and
// the start unnoticed.
func (s *server) start(ctx context.Context, conn net.Conn, req sandbox.Request) (*activation, *agentTurn, *exec.Cmd, *os.File, *os.File, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, err := s.lookup(req.Activation)
	if err != nil {
		return nil, nil, nil, nil, nil, err
	}
	if a.state != actIdle {
		return nil, nil, nil, nil, nil, sandbox.ErrAlreadyRun
	}
	if !a.leaseDeadline.IsZero() && !boottime.Now().Before(a.leaseDeadline) {
		// The lease may be gone: no prompt starts under it (K5).
		return nil, nil, nil, nil, nil, sandbox.ErrDeadlinePassed
	}
	if s.running != nil {
		// Cannot happen: activate returns only after the older turn ended.
		return nil, nil, nil, nil, nil, sandbox.ErrBusy
	}
	// Spent from here on, whatever happens next: one prompt per activation.
	a.state = actStartFailed
	// Recorded before the agent can read the prompt (K13): a supervisor
	// killed before this turn ends leaves a record naming this activation
	// at the boundary it started from, not the previous turn's, which the
	// next activation would otherwise present as if this one never ran —
	// or, in a state taken over from a release that kept no records, as if
	// no turn had run since (Unrecorded). No record, no turn.
	prev := s.retained
	if err := s.retain(&sandbox.Retained{Activation: a.id, NativeTurn: s.nativeTurn, Ended: sandbox.EndedUnfinished}); err != nil {
		s.retained = prev
		return nil, nil, nil, nil, nil, fmt.Errorf("%w: record the turn: %v", sandbox.ErrStartFailed, err)
	}

	tctx, cancel := context.WithCancel(ctx)
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		cancel()
		return nil, nil, nil, nil, nil, fmt.Errorf("%w: pipe: %v", sandbox.ErrStartFailed, err)
	}
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		cancel()
		stdinR.Close()
		stdinW.Close()
		return nil, nil, nil, nil, nil, fmt.Errorf("%w: pipe: %v", sandbox.ErrStartFailed, err)
	}
	cmd := exec.CommandContext(tctx, req.Command[0], req.Command[1:]...)
	cmd.Dir = s.cfg.Workspace
	cmd.Env = s.cfg.AgentEnv
	cmd.Stdin = stdinR
	cmd.Stdout = stdoutW
	cmd.Stderr = s.cfg.AgentStderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: s.cfg.AgentCredential}
	cmd.Cancel = func() error { return unix.Kill(-cmd.Process.Pid, unix.SIGKILL) }
	cmd.WaitDelay = s.cfg.DrainTimeout
	err = cmd.Start()
	stdinR.Close()
	stdoutW.Close()
	if err != nil {
		cancel()
		stdinW.Close()
		stdoutR.Close()
		return nil, nil, nil, nil, nil, fmt.Errorf("%w: %v", sandbox.ErrStartFailed, err)
	}
	t := &agentTurn{cancel: cancel, done: make(chan struct{}), conn: conn, grace: s.cfg.DrainTimeout, moved: make(chan struct{}, 1), pid: cmd.Process.Pid}
	a.state = actRunning
	a.turn = t
	s.running = t
	return a, t, cmd, stdoutR, stdinW, nil
}

func resultOf(cmd *exec.Cmd, waitErr error) sandbox.Result {
	ps := cmd.ProcessState
	if ps == nil {
		return sandbox.Result{ExitCode: -1, Signal: "unknown"}
	}
	res := sandbox.Result{ExitCode: ps.ExitCode()}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		res.Signal = unix.SignalName(ws.Signal())
	}
	return res
}

// readAgentLine reads one line of at most max bytes. A longer line is cut
// at max (truncated is true) and the rest of it discarded.
func readAgentLine(r *bufio.Reader, max int) (line []byte, truncated bool, err error) {
	for {
		chunk, err := r.ReadSlice('\n')
		if !truncated {
			room := max - len(line)
			if len(chunk) > room {
				line = append(line, chunk[:room]...)
				truncated = true
			} else {
				line = append(line, chunk...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return bytes.TrimRight(line, "\r\n"), truncated, err
	}
}

// makeEvent turns one agent stdout line into an event, and returns the
// native turn ordinal the line reports, if it reports one.
func makeEvent(seq int64, line []byte, truncated bool) (sandbox.Event, int64) {
	ev := sandbox.Event{Seq: seq, Time: time.Now().UTC(), Type: "agent.output"}
	if truncated {
		ev.Type = "agent.output_truncated"
		ev.Data, _ = json.Marshal(string(line))
		return ev, 0
	}
	trimmed := bytes.TrimSpace(line)
	if len(trimmed) > 0 && trimmed[0] == '{' && json.Valid(trimmed) {
		var head struct {
			Type       json.RawMessage `json:"type"`
			NativeTurn json.RawMessage `json:"native_turn"`
		}
		_ = json.Unmarshal(trimmed, &head)
		var typ string
		if json.Unmarshal(head.Type, &typ) == nil && typ != "" {
			ev.Type = typ
		}
		var nt int64
		if json.Unmarshal(head.NativeTurn, &nt) != nil {
			nt = 0
		}
		ev.Data = append(json.RawMessage(nil), trimmed...)
		return ev, nt
	}
	ev.Data, _ = json.Marshal(string(line))
	return ev, 0
}

func readRequest(r io.Reader) (sandbox.Request, error) {
	line, err := sandbox.ReadLine(bufio.NewReaderSize(r, 64<<10), sandbox.MaxMessageBytes)
	if err != nil {
		return sandbox.Request{}, err
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	var req sandbox.Request
	if err := dec.Decode(&req); err != nil {
		return sandbox.Request{}, err
	}
	if dec.More() {
		return sandbox.Request{}, errors.New("trailing data after request")
	}
	if req.V < sandbox.Version1 || req.V > sandbox.ProtocolVersion {
		return sandbox.Request{}, fmt.Errorf("protocol version %d not supported", req.V)
	}
	return req, nil
}

func writeMsg(w io.Writer, resp sandbox.Response) error {
	b, err := json.Marshal(resp)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

func errReply(err error) sandbox.Response {
	return sandbox.Response{Error: sandbox.ReplyOf(err)}
}
