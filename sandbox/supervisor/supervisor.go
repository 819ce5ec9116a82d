// Package supervisor is the sandbox manager, "runnerd supervise": one
// long-lived process per conversation, inside its sandbox (PID 1 of the
// docker container, or a local process for the process backend). It keeps
// the native session's turn ordinal, serves the protocol of package sandbox
// on a unix socket, and runs one agent turn at a time: the agent command
// with the workspace as working directory, the prompt on stdin, its
// JSON-lines stdout as the event stream.
//
// Ownership is by activation token. Each activation fences every older
// token (their calls are refused) and stops the turn an older token still
// runs. The settlement receipt of the newest token is kept, in memory only,
// until the next activation (R26); a restarted supervisor knows no token,
// so a completion it cannot confirm fails closed (R28). What it retains of
// the last activation that ran a turn — its token, the boundary it left,
// how it ended — is also kept in the state directory, and the next
// activation's answer carries it: the evidence a quarantined
// conversation's next turn verifies (K13), which survives a restart or a
// replacement of the supervisor over the same state.
//
// Only the runnerd main (the "supervise" subcommand) and tests import this
// package; turn code talks to it through sandbox.Client.
package supervisor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/runnerd/runnerd/internal/atomicfile"
	"github.com/runnerd/runnerd/internal/boottime"
	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/wire"
)

// Config configures a supervisor. Zero fields mean the default.
type Config struct {
	// Socket is the path of the unix socket to serve. Required. Its
	// directory should be private to the runnerd user.
	Socket string
	// Workspace is the agent's working directory. Required; created if
	// missing.
	Workspace string
	// StateDir holds the supervisor's durable state (the native turn
	// ordinal, the boundary R31 verifies). It must not be inside the
	// workspace, where the agent writes at will. Default: "supervisor-state"
	// beside the workspace. Whether the agent can reach it anyway is the
	// backend's business (docs/operations.md): docker mounts a directory
	// only root can write and runs the agent as AgentCredential.
	StateDir string
	// AgentCredential, if set, is the user the agents run as; the
	// supervisor then needs CAP_SETUID, CAP_SETGID and CAP_KILL (to stop
	// them). Default: the supervisor's own user.
	AgentCredential *syscall.Credential
	// ID is the sandbox identity reported by status. Default "".
	ID string
	// AgentEnv is the agent's whole environment. Default: PATH, LANG and
	// HOME=Workspace only, so no secret of the host's environment reaches
	// the agent.
	AgentEnv []string
	// AgentStderr receives the agent's stderr. Default: /dev/null.
	AgentStderr io.Writer
	// Logger receives the supervisor's records. Default: discarded.
	Logger *slog.Logger
	// RequestTimeout bounds reading a request after a connection opens.
	// Default 10 s.
	RequestTimeout time.Duration
	// DrainTimeout bounds reading what is left of the agent's stdout after
	// the agent exited and its process group was killed, and writing to a
	// driving connection that stopped reading once its turn is stopped.
	// Default 2 s.
	DrainTimeout time.Duration
	// MaxConns bounds concurrent connections; more are refused. Default 32.
	MaxConns int
	// Ready, if set, is called once the socket is listening.
	Ready func()
	// ACPTimeout bounds each of an ACP agent's answers to initialize and to
	// session/new or session/load; an agent that does not answer in time is
	// stopped and the turn fails before admission (agent_unresponsive).
	// Default 30 s.
	ACPTimeout time.Duration
	// Subreaper makes the supervisor a child subreaper that reaps orphans:
	// processes an agent left behind are reparented to it and, once dead,
	// reaped between turns (never while an agent runs, so the agent's own
	// exit status is not stolen). Main sets it when the supervisor is PID 1
	// of a container, where nothing else would reap them and zombies would
	// eat the pids limit. Only for a process whose only children are agents.
	Subreaper bool
	// TeardownBudget is how long, from a lines turn's stop (cancel, fence,
	// deadline, dropped driver), every process of its agent's tree then
	// has to be gone; the survivors are named in a
	// sandbox_teardown_incomplete record (S6). Default
	// sandbox.DefaultTeardownBudget.
	TeardownBudget time.Duration
}

func (c Config) withDefaults() (Config, error) {
	if c.Socket == "" || c.Workspace == "" {
		return c, errors.New("supervisor: socket and workspace are required")
	}
	if c.StateDir == "" {
		c.StateDir = filepath.Join(filepath.Dir(filepath.Clean(c.Workspace)), "supervisor-state")
	}
	if within(c.StateDir, c.Workspace) {
		return c, errors.New("supervisor: the state directory must not be inside the workspace, where the agent writes")
	}
	if c.AgentEnv == nil {
		c.AgentEnv = []string{
			"PATH=/usr/local/bin:/usr/bin:/bin",
			"LANG=C.UTF-8",
			"HOME=" + c.Workspace,
		}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 10 * time.Second
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = 2 * time.Second
	}
	if c.TeardownBudget <= 0 {
		c.TeardownBudget = sandbox.DefaultTeardownBudget
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 32
	}
	if c.ACPTimeout <= 0 {
		c.ACPTimeout = 30 * time.Second
	}
	return c, nil
}

// Activation states.
type actState int

const (
	actIdle        actState = iota // activated, no prompt yet
	actRunning                     // the prompt was handed; the agent runs
	actCompleted                   // the agent exited on its own
	actInterrupted                 // stopped: connection dropped, fenced, shutdown
	actStartFailed                 // the agent could not be started; no prompt reached it
	// actInterruptSettled: interrupted on request (K10); it settles like a
	// completed turn, its receipt marked interrupted.
	actInterruptSettled
)

type activation struct {
	id      string
	gen     uint64
	state   actState
	turn    *agentTurn
	result  sandbox.Result
	receipt *wire.SupervisorReceipt
	// leaseDeadline is when the agent of this activation is stopped by the
	// supervisor itself (K5), on CLOCK_BOOTTIME; zero means none.
	leaseDeadline boottime.Instant
}

// Server is one supervisor. Use Serve.
type server struct {
	cfg       Config
	instance  string // random, per process: tokens of another process are unknown
	startedAt time.Time
	log       *slog.Logger

	mu         sync.Mutex // guards the fields below and every activation's
	gen        uint64
	current    *activation
	nativeTurn int64
	running    *agentTurn // the one agent turn that may be alive
	// retained is the record of the last activation that ran a turn, as
	// stored in RetainedFile (as its turn starts, and as it ends); nil if
	// the state holds none.
	retained *sandbox.Retained
	// acp is the conversation's ACP agent once prepared, until it exits;
	// acpStarting the one being started (so that the orphan reaper leaves
	// it alone); acpSession the session id kept in ACPSessionFile, which
	// every retained record carries.
	acp         *acpAgent
	acpStarting *acpAgent
	acpSession  string

	prepareMu sync.Mutex // held by one prepare at a time; taken before mu
}

// Serve runs the supervisor until ctx ends, then stops any running agent
// and returns once every connection handler has returned.
func Serve(ctx context.Context, cfg Config) error {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(cfg.Workspace, 0o755); err != nil {
		return fmt.Errorf("supervisor: create workspace: %w", err)
	}
	if err := ensurePrivateDir(cfg.StateDir); err != nil {
		return fmt.Errorf("supervisor: state dir: %w", err)
	}
	s := &server{cfg: cfg, instance: randomHex(6), startedAt: time.Now(), log: cfg.Logger}
	hadBoundary, err := stateFileExists(cfg.StateDir, nativeTurnFile)
	if err != nil {
		return err
	}
	if s.nativeTurn, err = loadNativeTurn(cfg.StateDir); err != nil {
		return err
	}
	if s.retained, err = loadRetained(cfg.StateDir); err != nil {
		return err
	}
	// The conversation's ACP session, kept durably before any prompt
	// reached it, is known from the start, not from the next prepare:
	// every record carries it, so a record written before the agent is
	// prepared again (an activation after an idle stop that then runs
	// nothing) still names the session its turns ran on (K13, A6). A
	// file that cannot be read is recorded; the next prepare refuses on it.
	if kept, err := loadACPSession(cfg.StateDir); err != nil {
		recordStateFailure(s.log, "acp_session_load")
	} else if kept != nil {
		s.acpSession = kept.SessionID
	}
	if err := s.completeBoundary(); err != nil {
		return err
	}
	if err := s.markState(hadBoundary); err != nil {
		return err
	}
	// Written at once, 0 for a new session: a state directory of this
	// release always holds the file, so a backend never takes what an agent
	// wrote to the previous release's place for a boundary to adopt.
	if err := storeNativeTurn(cfg.StateDir, s.nativeTurn); err != nil {
		return fmt.Errorf("supervisor: write native turn: %w", err)
	}
	var (
		wg    sync.WaitGroup
		cmu   sync.Mutex
		conns = map[net.Conn]struct{}{}
		slots = make(chan struct{}, cfg.MaxConns)
	)
	// A subreaper before the first turn can start.
	stopReaper := func() {}
	if cfg.Subreaper {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("supervisor: become subreaper: %w", err)
		}
		sigc := make(chan os.Signal, 1)
		signal.Notify(sigc, syscall.SIGCHLD)
		defer signal.Stop(sigc)
		reaperDone := make(chan struct{})
		stopReaper = func() { close(reaperDone) }
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-reaperDone:
					return
				case <-sigc:
					s.mu.Lock()
					s.reapOrphansLocked()
					s.mu.Unlock()
				}
			}
		}()
	}

	l, err := sandbox.ListenUnix(cfg.Socket)
	if err != nil {
		stopReaper()
		wg.Wait()
		return fmt.Errorf("supervisor: %w", err)
	}
	recordStarted(s.log, s.nativeTurn)
	if cfg.Ready != nil {
		cfg.Ready()
	}

	stop := context.AfterFunc(ctx, func() {
		l.Close()
		s.stopRunning(stopShutdown)
		cmu.Lock()
		for c := range conns {
			c.Close()
		}
		cmu.Unlock()
	})
	defer stop()

	var acceptErr error
	for {
		conn, err := l.Accept()
		if err != nil {
			if ctx.Err() == nil {
				acceptErr = fmt.Errorf("supervisor: accept: %w", err)
				l.Close()
				s.stopRunning(stopShutdown)
			}
			break
		}
		select {
		case slots <- struct{}{}:
		default:
			_ = writeMsg(conn, sandbox.Response{Error: &sandbox.ErrorReply{Code: sandbox.CodeBusy, Message: "too many connections"}})
			conn.Close()
			continue
		}
		cmu.Lock()
		conns[conn] = struct{}{}
		cmu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			s.handle(ctx, conn)
			conn.Close()
			cmu.Lock()
			delete(conns, conn)
			cmu.Unlock()
		}()
	}
	// Close what is still open (an accept error ends the loop without ctx).
	cmu.Lock()
	for c := range conns {
		c.Close()
	}
	cmu.Unlock()
	stopReaper()
	wg.Wait()
	s.mu.Lock()
	ag := s.acp
	s.mu.Unlock()
	if ag != nil {
		ag.kill() // the conversation's ACP agent does not outlive its supervisor
	}
	recordStopped(s.log)
	return acceptErr
}

func (s *server) handle(ctx context.Context, conn net.Conn) {
	_ = conn.SetReadDeadline(time.Now().Add(s.cfg.RequestTimeout))
	req, err := readRequest(conn)
	if err != nil {
		recordRefused(s.log, "", sandbox.CodeProtocol)
		_ = writeMsg(conn, errReply(fmt.Errorf("%w: %v", sandbox.ErrProtocol, err)))
		return
	}
	_ = conn.SetReadDeadline(time.Time{})
	var resp sandbox.Response
	switch req.Op {
	case sandbox.OpStatus:
		st := s.status()
		resp.Status = &st
	case sandbox.OpActivate:
		if a, err := s.activate(req.LeaseDeadline); err != nil {
			resp = errReply(err)
		} else {
			resp.Activation = &a
		}
	case sandbox.OpDeadline:
		if err := s.setDeadline(req.Activation, req.LeaseDeadline); err != nil {
			resp = errReply(err)
		} else {
			resp.Deadline = &sandbox.Deadline{LeaseDeadline: req.LeaseDeadline}
		}
	case sandbox.OpInterrupt:
		r, err := s.interrupt(req.Activation, time.Duration(req.GraceMS)*time.Millisecond)
		if err != nil {
			resp = errReply(err)
		} else {
			resp.Receipt = &r
		}
	case sandbox.OpSettle:
		r, err := s.settle(req.Activation)
		if err != nil {
			resp = errReply(err)
		} else {
			resp.Receipt = &r
		}
	case sandbox.OpPrepare:
		if p, err := s.prepare(req); err != nil {
			resp = errReply(err)
		} else {
			resp.Prepared = &p
		}
	case sandbox.OpRun:
		s.run(ctx, conn, req)
		return
	default:
		resp = errReply(fmt.Errorf("%w: unknown operation", sandbox.ErrProtocol))
	}
	if resp.Error != nil {
		recordRefused(s.log, req.Op, resp.Error.Code)
	}
	_ = writeMsg(conn, resp)
}

func (s *server) status() sandbox.Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return sandbox.Status{
		Version:    sandbox.ProtocolVersion,
		ID:         s.cfg.ID,
		PID:        os.Getpid(),
		Busy:       s.running != nil,
		Unloadable: s.acp != nil && !s.acp.loadable,
		NativeTurn: s.nativeTurn,
		StartedAt:  s.startedAt,
	}
}

// activate issues a new token, fences every older one and stops a turn one
// of them still runs; it returns once that agent is dead.
// The answer carries what the supervisor retains of the activation it
// fenced (K13): the record of its turn, once that turn has ended, or, for
// one that ran nothing, its token at the unchanged boundary; after a
// restart, the record in the state directory.
func (s *server) activate(leaseDeadline boottime.Instant) (sandbox.Activation, error) {
	s.mu.Lock()
	s.gen++
	a := &activation{gen: s.gen, id: fmt.Sprintf("%s.%d.%s", s.instance, s.gen, randomHex(8)), leaseDeadline: leaseDeadline}
	s.current = a
	old := s.running
	s.mu.Unlock()
	if old != nil {
		old.stop(stopFenced)
		<-old.done
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	recordActivated(s.log, a.gen, old != nil)
	var previous *sandbox.Retained
	if s.retained != nil {
		r := *s.retained
		previous = &r
	}
	// This activation's own record, on disk before its token is handed out
	// (K13): if it is admitted and its supervisor dies before its turn
	// starts, or it runs nothing, the next activation still finds it — and,
	// through LastRan, the activation before it that ran a turn. Its turn's
	// start replaces it (retainTurn, EndedUnfinished).
	// No record on disk, no token: an admitted turn whose activation the
	// next one cannot find would be judged on its record's absence.
	prev := s.retained
	if err := s.retain(&sandbox.Retained{Activation: a.id, NativeTurn: s.nativeTurn, Ended: sandbox.EndedNotRun,
		LastRan: lastRan(s.retained), Idle: idleSince(s.retained),
		Unrecorded: s.retained != nil && s.retained.Ended == sandbox.EndedNotRun && s.retained.Unrecorded}); err != nil {
		s.retained = prev
		return sandbox.Activation{}, fmt.Errorf("record the activation: %w", err)
	}
	return sandbox.Activation{ID: a.id, NativeTurn: s.nativeTurn, Previous: previous}, nil
}

// completeBoundary finishes what a supervisor killed inside retainTurn
// left half done. retainTurn writes the ended turn's record first and the
// native turn after it, so a kill between the two leaves a record that
// names the ended turn and the boundary it left, beside the boundary from
// before that turn. The record is the newer of the two and the positive
// evidence of where the session is: the boundary is moved on to it, as
// the dead supervisor was about to do. Left as it was, the next
// activation would present a record that disagrees with its boundary, and
// a quarantined conversation would be lost on a write that did not happen
// (K13). Only an ended turn's record moves the boundary: a record of a
// turn that ran nothing or had not ended carries the boundary unchanged.
func (s *server) completeBoundary() error {
	r := s.retained
	if r == nil || r.Ended == sandbox.EndedNotRun || r.Ended == sandbox.EndedUnfinished || r.NativeTurn <= s.nativeTurn {
		return nil
	}
	from := s.nativeTurn
	if err := storeNativeTurn(s.cfg.StateDir, r.NativeTurn); err != nil {
		return fmt.Errorf("supervisor: complete the native turn of the last record: %w", err)
	}
	s.nativeTurn = r.NativeTurn
	recordBoundaryCompleted(s.log, from, r.NativeTurn)
	return nil
}

// idleSince is the activations after the last that ran a turn that ran
// nothing, as record r tells it, r's own included when it ran nothing.
func idleSince(r *sandbox.Retained) []string {
	if r == nil || r.Ended != sandbox.EndedNotRun {
		return nil
	}
	idle := slices.Clip(r.Idle)
	if r.Activation != "" {
		idle = append(idle, r.Activation)
	}
	return idle
}

// lastRan is the last activation that ran a turn, as record r tells it.
func lastRan(r *sandbox.Retained) string {
	switch {
	case r == nil:
		return ""
	case r.Ended == sandbox.EndedNotRun:
		return r.LastRan
	}
	return r.Activation
}

// markState makes the state one of a release that keeps retained records
// (StateVersionFile), once, before any activation's record is written:
// from then on a missing record is a lost one (K13). A state that has a
// boundary (hadBoundary) but neither the marker nor a record file was
// written by a release that kept no records — the previous release: its
// turns ran unrecorded, and the record saying so (Unrecorded) is written
// first, the marker after it, so that a crash between the two leaves a
// record and no marker, which the next start marks the same way. A record
// file there but no marker is a state of a release that kept records
// before the marker existed.
func (s *server) markState(hadBoundary bool) error {
	marked, err := stateFileExists(s.cfg.StateDir, sandbox.StateVersionFile)
	if err != nil || marked {
		return err
	}
	recorded, err := stateFileExists(s.cfg.StateDir, sandbox.RetainedFile)
	if err != nil {
		return err
	}
	if hadBoundary && !recorded {
		if err := s.retain(&sandbox.Retained{NativeTurn: s.nativeTurn, Ended: sandbox.EndedNotRun, Unrecorded: true}); err != nil {
			return fmt.Errorf("supervisor: record the state taken over: %w", err)
		}
		recordStateTakenOver(s.log, s.nativeTurn)
	}
	if err := atomicfile.Write(filepath.Join(s.cfg.StateDir, sandbox.StateVersionFile), fmt.Appendf(nil, "%d\n", sandbox.StateVersion), 0o600); err != nil {
		return fmt.Errorf("supervisor: write the state version: %w", err)
	}
	return nil
}

// lookup returns the current activation for id, or why there is none.
// Called with s.mu held.
func (s *server) lookup(id string) (*activation, error) {
	if s.current != nil && id == s.current.id {
		return s.current, nil
	}
	parts := strings.Split(id, ".")
	if len(parts) == 3 && parts[0] == s.instance {
		if gen, err := strconv.ParseUint(parts[1], 10, 64); err == nil && s.current != nil && gen < s.current.gen {
			return nil, sandbox.ErrFenced
		}
	}
	return nil, sandbox.ErrUnknownActivation
}

// setDeadline moves the activation's lease deadline; a running turn of it
// re-arms its alarm.
func (s *server) setDeadline(id string, at boottime.Instant) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, err := s.lookup(id)
	if err != nil {
		return err
	}
	if a.turn != nil && a.turn.stopReason() == stopDeadline {
		return sandbox.ErrDeadlinePassed
	}
	a.leaseDeadline = at
	if a.turn != nil {
		a.turn.deadlineMoved()
	}
	return nil
}

func (s *server) settle(id string) (wire.SupervisorReceipt, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, err := s.lookup(id)
	if err != nil {
		return wire.SupervisorReceipt{}, err
	}
	switch a.state {
	case actIdle, actStartFailed:
		return wire.SupervisorReceipt{}, sandbox.ErrNotRun
	case actRunning:
		return wire.SupervisorReceipt{}, sandbox.ErrBusy
	case actInterrupted:
		return wire.SupervisorReceipt{}, sandbox.ErrInterrupted
	}
	if a.receipt == nil {
		a.receipt = &wire.SupervisorReceipt{
			ActivationID: a.id,
			ReceiptID:    "sr-" + randomHex(16),
			NativeTurn:   a.result.NativeTurn,
			ExitCode:     a.result.ExitCode,
			Interrupted:  a.state == actInterruptSettled,
		}
		recordSettled(s.log, a.gen, a.result.NativeTurn, a.result.ExitCode, a.receipt.Interrupted)
	}
	return *a.receipt, nil
}

// interrupt stops the activation's running turn on request (K10): SIGINT
// to the agent's process group, SIGKILL after grace, and once nothing of
// the turn runs, the activation's receipt, marked interrupted. A turn that
// ended on its own first answers its ordinary receipt; every other case
// answers as settle does.
func (s *server) interrupt(id string, grace time.Duration) (wire.SupervisorReceipt, error) {
	if grace <= 0 {
		grace = sandbox.DefaultInterruptGrace
	}
	grace = min(grace, sandbox.MaxInterruptGrace)
	s.mu.Lock()
	a, err := s.lookup(id)
	var t *agentTurn
	if err == nil && a.state == actRunning {
		t = a.turn
	}
	s.mu.Unlock()
	if err != nil {
		return wire.SupervisorReceipt{}, err
	}
	if t != nil {
		recordInterrupting(s.log, a.gen, grace)
		t.interrupt()
		timer := time.NewTimer(grace)
		select {
		case <-t.done:
			timer.Stop()
		case <-timer.C:
			if t.acpCancel != nil {
				// An ACP agent that does not answer its cancel is killed,
				// and the turn is not settled (A3, K13).
				t.cancelUnanswered()
			} else {
				t.stop(stopInterrupt) // kills the group; the reason stays as it was
			}
			<-t.done
		}
	}
	return s.settle(id)
}

// stopRunning stops the running agent turn, if any, and waits for it.
func (s *server) stopRunning(why stopReason) {
	s.mu.Lock()
	t := s.running
	s.mu.Unlock()
	if t != nil {
		t.stop(why)
		<-t.done
	}
}

// reapOrphansLocked reaps every dead child. Called with s.mu held and only
// when no agent runs: every child is then an orphan an agent left behind
// (start forks agents under the same lock).
func (s *server) reapOrphansLocked() {
	// A live ACP agent is a child too, between turns: its own reaper must
	// see its exit, and reaps the orphans once it has.
	if !s.cfg.Subreaper || s.running != nil || s.acp != nil || s.acpStarting != nil {
		return
	}
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		recordOrphanReaped(s.log, pid)
	}
}

// retainTurn records durably how activation a's turn ended and the
// boundary it left, n: first the record (RetainedFile), then the native
// turn. A crash between the two leaves the record ahead of the boundary,
// which the next start completes from the record (completeBoundary) —
// never a boundary ahead of the record, which would pass for a turn no
// record describes. Called with s.mu held.
func (s *server) retainTurn(a *activation, n int64, ended string) {
	_ = s.retain(&sandbox.Retained{Activation: a.id, NativeTurn: n, Ended: ended})
	s.setNativeTurn(n)
}

// retain makes r the retained record, durably (RetainedFile); in memory it
// is r even if the write fails, which is recorded and returned. Called
// with s.mu held.
func (s *server) retain(r *sandbox.Retained) error {
	r.ACPSession = s.acpSession
	s.retained = r
	b, err := json.Marshal(r)
	if err == nil {
		err = atomicfile.Write(filepath.Join(s.cfg.StateDir, sandbox.RetainedFile), append(b, '\n'), 0o600)
	}
	if err != nil {
		recordStateFailure(s.log, "retained_store")
	}
	return err
}

// setNativeTurn records a new native turn ordinal durably. Called with s.mu held.
func (s *server) setNativeTurn(n int64) {
	if n == s.nativeTurn {
		return
	}
	s.nativeTurn = n
	if err := storeNativeTurn(s.cfg.StateDir, n); err != nil {
		recordStateFailure(s.log, "native_turn_store")
	}
}

// within reports whether path is dir or inside it (lexically, after
// making both absolute).
func within(path, dir string) bool {
	p, err1 := filepath.Abs(path)
	d, err2 := filepath.Abs(dir)
	if err1 != nil || err2 != nil {
		return false
	}
	rel, err := filepath.Rel(d, p)
	return err == nil && (rel == "." || rel != ".." && !strings.HasPrefix(rel, "../"))
}

// ensurePrivateDir makes dir (0700) if missing and checks that it is a
// directory of this process's user, not a symlink put in its place.
func ensurePrivateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%s is not a directory of uid %d", dir, os.Geteuid())
	}
	return os.Chmod(dir, 0o700)
}

const nativeTurnFile = sandbox.NativeTurnFile

func loadNativeTurn(dir string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(dir, nativeTurnFile))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("supervisor: read native turn: %w", err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("supervisor: native turn file is corrupt: %w", err)
	}
	return n, nil
}

func storeNativeTurn(dir string, n int64) error {
	return atomicfile.Write(filepath.Join(dir, nativeTurnFile), fmt.Appendf(nil, "%d\n", n), 0o600)
}

// stateFileExists reports whether the state directory holds name.
func stateFileExists(dir, name string) (bool, error) {
	_, err := os.Lstat(filepath.Join(dir, name))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("supervisor: state file %s: %w", name, err)
	}
	return true, nil
}

// loadRetained reads RetainedFile; nil if there is none. A record that
// cannot be read is no evidence, and is not taken for one.
func loadRetained(dir string) (*sandbox.Retained, error) {
	b, err := os.ReadFile(filepath.Join(dir, sandbox.RetainedFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("supervisor: read the retained record: %w", err)
	}
	var r sandbox.Retained
	// Only the record of a state taken over (Unrecorded) names no activation.
	if err := json.Unmarshal(b, &r); err != nil || r.Activation == "" && !(r.Unrecorded && r.Ended == sandbox.EndedNotRun) {
		return nil, nil
	}
	return &r, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux
	return hex.EncodeToString(b)
}
