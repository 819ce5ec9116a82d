package supervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/internal/testbin"
	"github.com/runnerd/runnerd/wire"
)

// acpPrepared activates and prepares an ACP turn.
func acpPrepared(t *testing.T, c *sandbox.Client, command []string) (sandbox.Activation, sandbox.Prepared) {
	t.Helper()
	ctx := context.Background()
	act, err := c.Activate(ctx, 0)
	if err != nil {
		t.Fatalf("activate: %v", err)
	}
	p, err := c.Prepare(ctx, act.ID, command)
	if err != nil {
		t.Fatalf("prepare: %v", err)
	}
	return act, p
}

// acpRun activates, prepares, runs prompt to its end and settles it.
func acpRun(t *testing.T, c *sandbox.Client, command []string, prompt string, o sandbox.ACPOptions) (sandbox.Prepared, []sandbox.Event, sandbox.Result) {
	t.Helper()
	ctx := context.Background()
	act, p := acpPrepared(t, c, command)
	turn, err := c.RunACP(ctx, act.ID, prompt, o)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	defer turn.Close()
	evs, res := drain(t, turn)
	rc, err := c.Settle(ctx, act.ID)
	if err != nil || rc.NativeTurn != res.NativeTurn {
		t.Fatalf("settle: %+v, %v; want native turn %d", rc, err, res.NativeTurn)
	}
	return p, evs, res
}

func types(evs []sandbox.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Type)
	}
	return out
}

// texts are the agent_message_chunk texts of evs.
func texts(t *testing.T, evs []sandbox.Event) []string {
	t.Helper()
	var out []string
	for _, e := range evs {
		if e.Type != "agent_message_chunk" {
			continue
		}
		var u struct {
			Content struct {
				Text string `json:"text"`
			} `json:"content"`
		}
		if err := json.Unmarshal(e.Data, &u); err != nil {
			t.Fatalf("update %s: %v", e.Data, err)
		}
		out = append(out, u.Content.Text)
	}
	return out
}

func containsText(ts []string, sub string) bool {
	return slices.ContainsFunc(ts, func(s string) bool { return strings.Contains(s, sub) })
}

func inOrder(t *testing.T, evs []sandbox.Event) {
	t.Helper()
	for i, e := range evs {
		if e.Seq != int64(i+1) {
			t.Fatalf("event %d has seq %d: %v", i, e.Seq, types(evs))
		}
	}
}

// A1, A2, A4 against an ACP agent this project did not write (the SDK's
// example agent): each update is one event of its ACP kind, in order; the
// permission request is answered by the policy — allow picks the allow
// option, reject the reject option; the agent process outlives the turn
// and the next turn reuses it and its session.
func TestACPExampleAgentStreamsUpdatesAndAnswersByPolicy(t *testing.T) {
	agent := []string{testbin.ExampleAgent(t)}
	s := startServe(t, func(c *Config) { c.AgentStderr = os.Stderr })
	p1, evs, res := acpRun(t, s.c, agent, "hello", sandbox.ACPOptions{PermissionPolicy: wire.PermissionAllow})
	inOrder(t, evs)
	for _, want := range []string{"agent_message_chunk", "tool_call", "tool_call_update", EventPermissionRequested, EventPermissionAnswered} {
		if !slices.Contains(types(evs), want) {
			t.Fatalf("events %v lack %s", types(evs), want)
		}
	}
	if res.StopReason != "end_turn" || res.NativeTurn != 1 || res.Failure != "" {
		t.Fatalf("result %+v, want end_turn at native turn 1", res)
	}
	ts := texts(t, evs)
	if !containsText(ts, "successfully updated the configuration") {
		t.Fatalf("allow did not reach the agent as its allow option: %q", ts)
	}
	if !p1.Started || p1.Loaded {
		t.Fatalf("first prepare %+v, want a started agent with a new session", p1)
	}
	kept, err := loadACPSession(filepath.Join(filepath.Dir(s.ws), "supervisor-state"))
	if err != nil || kept == nil || kept.SessionID == "" {
		t.Fatalf("kept session %+v, %v", kept, err)
	}

	p2, evs, res := acpRun(t, s.c, agent, "again", sandbox.ACPOptions{PermissionPolicy: wire.PermissionReject})
	if p2.Started || p2.PID != p1.PID {
		t.Fatalf("second prepare %+v, want the same agent process %d kept", p2, p1.PID)
	}
	if ts := texts(t, evs); !containsText(ts, "prefer not to make that change") || res.NativeTurn != 2 {
		t.Fatalf("reject: texts %q, result %+v", ts, res)
	}
	again, _ := loadACPSession(filepath.Join(filepath.Dir(s.ws), "supervisor-state"))
	if again == nil || again.SessionID != kept.SessionID {
		t.Fatalf("session %+v after the second turn, want %s", again, kept.SessionID)
	}
	r, err := loadRetained(filepath.Join(filepath.Dir(s.ws), "supervisor-state"))
	if err != nil || r == nil || r.ACPSession != kept.SessionID {
		t.Fatalf("retained %+v, %v; want it to carry session %s", r, err, kept.SessionID)
	}
}

// A4 under ask: the request is an event with its options; the owner's
// answer on the driving connection reaches the agent; unanswered, it is
// answered cancelled after the timeout.
func TestACPExampleAgentAskPolicy(t *testing.T) {
	agent := []string{testbin.ExampleAgent(t)}
	s := startServe(t)
	ctx := context.Background()
	act, _ := acpPrepared(t, s.c, agent)
	turn, err := s.c.RunACP(ctx, act.ID, "hello", sandbox.ACPOptions{PermissionPolicy: wire.PermissionAsk})
	if err != nil {
		t.Fatal(err)
	}
	var evs []sandbox.Event
	for {
		ev := nextEvent(t, turn)
		evs = append(evs, ev)
		if ev.Type == EventPermissionRequested {
			var req struct {
				RequestID string `json:"request_id"`
				Options   []struct {
					OptionID string `json:"optionId"`
				} `json:"options"`
			}
			if err := json.Unmarshal(ev.Data, &req); err != nil || req.RequestID == "" || len(req.Options) != 2 {
				t.Fatalf("permission_requested %s: %v", ev.Data, err)
			}
			if err := turn.Answer(req.RequestID, "not-an-option"); err != nil {
				t.Fatal(err)
			}
			if err := turn.Answer(req.RequestID, "reject"); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	rest, res := drain(t, turn)
	turn.Close()
	evs = append(evs, rest...)
	if ts := texts(t, evs); !containsText(ts, "prefer not to make that change") || res.StopReason != "end_turn" {
		t.Fatalf("the owner's reject did not reach the agent: %q, %+v", ts, res)
	}
	if _, err := s.c.Settle(ctx, act.ID); err != nil {
		t.Fatal(err)
	}

	_, evs, _ = acpRun(t, s.c, agent, "unanswered", sandbox.ACPOptions{PermissionPolicy: wire.PermissionAsk, PermissionTimeout: 100 * time.Millisecond})
	var answered map[string]string
	for _, e := range evs {
		if e.Type == EventPermissionAnswered {
			_ = json.Unmarshal(e.Data, &answered)
		}
	}
	if answered["outcome"] != "cancelled" || answered["by"] != "timeout" {
		t.Fatalf("unanswered request answered %v, want cancelled by timeout", answered)
	}
}

// A3, K10 against the example agent: a cancel mid-turn is session/cancel;
// the agent's own "cancelled" settles the boundary; the next turn runs on
// the same agent process and session.
func TestACPExampleAgentCancelSettlesAndSessionContinues(t *testing.T) {
	agent := []string{testbin.ExampleAgent(t)}
	s := startServe(t)
	ctx := context.Background()
	act, p1 := acpPrepared(t, s.c, agent)
	turn, err := s.c.RunACP(ctx, act.ID, "hello", sandbox.ACPOptions{PermissionPolicy: wire.PermissionAllow})
	if err != nil {
		t.Fatal(err)
	}
	defer turn.Close()
	if ev := nextEvent(t, turn); ev.Type != "agent_message_chunk" {
		t.Fatalf("first event %s", ev.Type)
	}
	rc, err := s.c.Interrupt(ctx, act.ID, 10*time.Second)
	if err != nil || !rc.Interrupted || rc.NativeTurn != 1 {
		t.Fatalf("interrupt: %+v, %v; want an interrupted receipt at native turn 1", rc, err)
	}
	if err := streamEnd(turn); !errors.Is(err, sandbox.ErrInterrupted) {
		t.Fatalf("stream ended with %v", err)
	}
	p2, _, res := acpRun(t, s.c, agent, "next", sandbox.ACPOptions{PermissionPolicy: wire.PermissionAllow})
	if p2.Started || p2.PID != p1.PID || res.StopReason != "end_turn" || res.NativeTurn != 2 {
		t.Fatalf("after the cancel: prepare %+v (first pid %d), result %+v; want the same agent and session", p2, p1.PID, res)
	}
}

func demoACP(flags ...string) []string {
	return append([]string{demoAgent, "--acp"}, flags...)
}

// A3: an agent that does not answer session/cancel within the grace is
// killed, and the turn is interrupted, not settled (K13 then applies).
func TestACPCancelUnansweredIsKilledNotSettled(t *testing.T) {
	s := startServe(t)
	ctx := context.Background()
	act, p := acpPrepared(t, s.c, demoACP())
	turn, err := s.c.RunACP(ctx, act.ID, "!hang", sandbox.ACPOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer turn.Close()
	nextEvent(t, turn) // "turn 1": the prompt reached it
	if _, err := s.c.Interrupt(ctx, act.ID, 200*time.Millisecond); !errors.Is(err, sandbox.ErrInterrupted) {
		t.Fatalf("interrupt: %v, want interrupted without a receipt", err)
	}
	if err := testbin.WaitGone(p.PID, waitLimit); err != nil {
		t.Fatalf("the agent survived: %v", err)
	}
	r, _ := loadRetained(filepath.Join(filepath.Dir(s.ws), "supervisor-state"))
	if r == nil || r.Activation != act.ID || r.Ended != "cancel_unanswered" || r.NativeTurn != 0 {
		t.Fatalf("retained %+v", r)
	}
}

// A2, R25 against the demo agent: each prompt reaches it exactly once
// (its transcript); stop reasons are recorded; a JSON-RPC error or the
// agent's exit during a turn ends it with that failure; A6: the agent gone
// and loadSession advertised, the next turn starts it again and loads the
// kept session, and the replayed history is no event of that turn.
func TestACPDemoAgentPromptOnceStopReasonsAndResume(t *testing.T) {
	s := startServe(t)
	agent := demoACP()
	_, evs, res := acpRun(t, s.c, agent, "hello", sandbox.ACPOptions{})
	if !containsText(texts(t, evs), "echo: hello") || res.StopReason != "end_turn" {
		t.Fatalf("turn 1: %v, %+v", texts(t, evs), res)
	}
	_, _, res = acpRun(t, s.c, agent, "!stop max_tokens", sandbox.ACPOptions{})
	if res.StopReason != "max_tokens" || res.Failure != "" || res.NativeTurn != 2 {
		t.Fatalf("turn 2: %+v, want max_tokens recorded", res)
	}
	_, _, res = acpRun(t, s.c, agent, "!error", sandbox.ACPOptions{})
	if res.Failure != sandbox.FailureACPError || res.NativeTurn != 3 {
		t.Fatalf("turn 3: %+v, want %s", res, sandbox.FailureACPError)
	}
	p, _, res := acpRun(t, s.c, agent, "!crash", sandbox.ACPOptions{})
	if res.Failure != sandbox.FailureACPAgentExit || res.Signal != "SIGKILL" {
		t.Fatalf("turn 4: %+v, want %s by SIGKILL", res, sandbox.FailureACPAgentExit)
	}
	if err := testbin.WaitGone(p.PID, waitLimit); err != nil {
		t.Fatal(err)
	}
	p5, evs, res := acpRun(t, s.c, agent, "after the crash", sandbox.ACPOptions{})
	if !p5.Started || !p5.Loaded || p5.PID == p.PID {
		t.Fatalf("turn 5 prepare %+v, want a new agent that loaded the session", p5)
	}
	if slices.Contains(types(evs), "user_message_chunk") || !containsText(texts(t, evs), "turn 5") {
		t.Fatalf("turn 5 events %v %q: the replay must not be re-emitted, and the session continues", types(evs), texts(t, evs))
	}
	want := []string{"hello", "!stop max_tokens", "!error", "!crash", "after the crash"}
	if got := transcript(t, s.ws); !slices.Equal(got, want) {
		t.Fatalf("transcript %q, want %q: every prompt exactly once", got, want)
	}
	if res.NativeTurn != 5 {
		t.Fatalf("turn 5 result %+v", res)
	}
}

// A6: an agent that does not advertise loadSession, once its process is
// gone, makes the conversation unrecoverable — never a new session.
func TestACPAgentWithoutLoadSessionIsNotLoadable(t *testing.T) {
	s := startServe(t)
	agent := demoACP("--no-load-session")
	acpRun(t, s.c, agent, "hello", sandbox.ACPOptions{})
	acpRun(t, s.c, agent, "!crash", sandbox.ACPOptions{})
	act, err := s.c.Activate(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.c.Prepare(context.Background(), act.ID, agent); !errors.Is(err, sandbox.ErrSessionNotLoadable) {
		t.Fatalf("prepare: %v, want %v", err, sandbox.ErrSessionNotLoadable)
	}
	if n := s.rec.count(RecordACPNotLoadable); n != 1 {
		t.Fatalf("%d records %s", n, RecordACPNotLoadable)
	}
	if got := transcript(t, s.ws); !slices.Equal(got, []string{"hello", "!crash"}) {
		t.Fatalf("transcript %q", got)
	}
}

// Bad input before admission: an agent that never answers initialize is
// agent_unresponsive, one that exits during it a start failure; both are
// stopped, no prompt reached them, and the next prepare (a good agent)
// works. A malformed JSON-RPC line, an unknown-method-free flood and an
// oversize update do not break a turn.
func TestACPBadAgents(t *testing.T) {
	s := startServe(t, func(c *Config) { c.ACPTimeout = time.Second })
	ctx := context.Background()
	act, err := s.c.Activate(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.c.Prepare(ctx, act.ID, demoACP("--init=hang")); !errors.Is(err, sandbox.ErrAgentUnresponsive) {
		t.Fatalf("initialize unanswered: %v, want %v", err, sandbox.ErrAgentUnresponsive)
	}
	if _, err := s.c.Prepare(ctx, act.ID, demoACP("--init=exit")); !errors.Is(err, sandbox.ErrStartFailed) || !strings.Contains(err.Error(), "exited during initialize") {
		t.Fatalf("exit in initialize: %v", err)
	}
	if got := transcript(t, s.ws); len(got) != 0 {
		t.Fatalf("a prompt reached an agent that was never initialized: %q", got)
	}
	_, evs, res := acpRun(t, s.c, demoACP("--init=garbage"), "!garbage\n!flood 500\n!big 300000\nstill here", sandbox.ACPOptions{})
	inOrder(t, evs)
	if res.StopReason != "end_turn" || !containsText(texts(t, evs), "echo: still here") || !containsText(texts(t, evs), "delta 500 of 500") {
		t.Fatalf("result %+v, %d events", res, len(evs))
	}
	truncated := 0
	for _, e := range evs {
		if len(e.Data) > sandbox.MaxEventBytes {
			t.Fatalf("event of %d bytes", len(e.Data))
		}
		var m map[string]any
		if json.Unmarshal(e.Data, &m) == nil && m["truncated"] == true {
			truncated++
		}
	}
	if truncated != 1 {
		t.Fatalf("%d truncated events, want the big one", truncated)
	}
}

// A5: fs/* is served inside the workspace only; "..", another absolute path
// and a symlink leading out are JSON-RPC errors and touch nothing; a write
// inside is on disk when answered.
func TestACPFilesystemConfined(t *testing.T) {
	s := startServe(t)
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("untouched"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(s.ws, "notes"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(s.ws, "link")); err != nil {
		t.Fatal(err)
	}
	prompt := strings.Join([]string{
		"!write ../../etc/passwd evil",
		"!write " + victim + " evil",
		"!write link/victim evil",
		"!write link/new evil",
		"!read link/victim",
		"!read ../../../../../../etc/hostname",
		"!write notes/a.txt hello",
		"!read notes/a.txt",
	}, "\n")
	_, evs, _ := acpRun(t, s.c, demoACP(), prompt, sandbox.ACPOptions{})
	ts := texts(t, evs)
	for _, want := range []string{
		"write ../../etc/passwd: refused -32602",
		"write " + victim + ": refused -32602",
		"write link/victim: refused -32602",
		"write link/new: refused -32602",
		"read link/victim: refused -32602",
		"read ../../../../../../etc/hostname: refused -32602",
		"write notes/a.txt: ok",
		"read notes/a.txt: hello",
	} {
		if !slices.Contains(ts, want) {
			t.Errorf("no %q in %q", want, ts)
		}
	}
	if b, _ := os.ReadFile(victim); string(b) != "untouched" {
		t.Fatalf("the file outside was written: %q", b)
	}
	if _, err := os.Lstat(filepath.Join(outside, "new")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a file was created outside: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(filepath.Dir(filepath.Dir(s.ws)), "etc", "passwd")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("../../etc/passwd was created: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(s.ws, "notes", "a.txt")); string(b) != "hello" {
		t.Fatalf("the write inside: %q", b)
	}
}

// A2, A4: a permission_requested larger than the event bound is truncated
// and says so, like any event, but keeps its request id, options and
// policy whole: the owner can still answer it, and the answer reaches the
// agent.
func TestACPPermissionRequestOverTheBoundIsTruncated(t *testing.T) {
	s := startServe(t)
	ctx := context.Background()
	act, _ := acpPrepared(t, s.c, demoACP())
	turn, err := s.c.RunACP(ctx, act.ID, "!permission 400000", sandbox.ACPOptions{PermissionPolicy: wire.PermissionAsk})
	if err != nil {
		t.Fatal(err)
	}
	defer turn.Close()
	var evs []sandbox.Event
	for {
		ev := nextEvent(t, turn)
		evs = append(evs, ev)
		if ev.Type != EventPermissionRequested {
			continue
		}
		if len(ev.Data) > sandbox.MaxEventBytes {
			t.Fatalf("permission_requested of %d bytes, over the bound %d", len(ev.Data), sandbox.MaxEventBytes)
		}
		var req struct {
			RequestID string `json:"request_id"`
			Policy    string `json:"policy"`
			Truncated bool   `json:"truncated"`
			Bytes     int    `json:"bytes"`
			ToolCall  struct {
				Truncated bool   `json:"truncated"`
				Head      string `json:"head"`
			} `json:"tool_call"`
			Options []struct {
				OptionID string `json:"optionId"`
			} `json:"options"`
		}
		if err := json.Unmarshal(ev.Data, &req); err != nil {
			t.Fatalf("permission_requested %.200s: %v", ev.Data, err)
		}
		if !req.Truncated || req.Bytes <= 400000 || !req.ToolCall.Truncated || !strings.HasPrefix(req.ToolCall.Head, "{") {
			t.Fatalf("permission_requested does not say it was truncated: truncated %v, bytes %d, tool call truncated %v",
				req.Truncated, req.Bytes, req.ToolCall.Truncated)
		}
		if req.RequestID == "" || req.Policy != wire.PermissionAsk || len(req.Options) != 2 || req.Options[0].OptionID != "yes" {
			t.Fatalf("the truncated request lost what answering needs: %+v", req)
		}
		if err := turn.Answer(req.RequestID, "yes"); err != nil {
			t.Fatal(err)
		}
		break
	}
	rest, res := drain(t, turn)
	evs = append(evs, rest...)
	inOrder(t, evs)
	if !slices.Contains(texts(t, evs), "permission: yes") || res.StopReason != "end_turn" {
		t.Fatalf("the owner's answer did not reach the agent: %q, %+v", texts(t, evs), res)
	}
	if _, err := s.c.Settle(ctx, act.ID); err != nil {
		t.Fatal(err)
	}
}

// Bad input on a kept connection: a request of a method ACP does not
// have, an extension method and terminal/create are declined (method not
// found, -32601), and a response to an id the client never sent is
// dropped; none of them breaks the turn or the connection: the next turn
// runs on the same agent process.
func TestACPUnknownMethodsAndStrayResponses(t *testing.T) {
	s := startServe(t)
	p1, evs, res := acpRun(t, s.c, demoACP(), "!unknown\n!orphan\nstill here", sandbox.ACPOptions{})
	ts := texts(t, evs)
	for _, want := range []string{"extension: refused -32601", "terminal: refused -32601", "echo: still here"} {
		if !slices.Contains(ts, want) {
			t.Fatalf("no %q in %q", want, ts)
		}
	}
	if res.StopReason != "end_turn" || res.Failure != "" {
		t.Fatalf("result %+v", res)
	}
	p2, evs, res := acpRun(t, s.c, demoACP(), "next", sandbox.ACPOptions{})
	if p2.Started || p2.PID != p1.PID || res.StopReason != "end_turn" || !containsText(texts(t, evs), "echo: next") {
		t.Fatalf("next turn: prepare %+v (first pid %d), result %+v", p2, p1.PID, res)
	}
}

// A2: the bound holds whatever the update holds: quoting the head of one
// full of characters JSON escapes (<, >, &, quotes) makes it several times
// longer, and the note still fits.
func TestACPBoundedEventData(t *testing.T) {
	for _, fill := range []string{"x", "<", `\"`, "é"} {
		data, _ := json.Marshal(map[string]string{"text": strings.Repeat(fill, sandbox.MaxEventBytes)})
		b, truncated := bounded(data, sandbox.MaxEventBytes)
		var note struct {
			Truncated bool   `json:"truncated"`
			Bytes     int    `json:"bytes"`
			Head      string `json:"head"`
		}
		if err := json.Unmarshal(b, &note); err != nil || !truncated || !note.Truncated || note.Bytes != len(data) || len(b) > sandbox.MaxEventBytes || len(note.Head) < sandbox.MaxEventBytes/16 {
			t.Fatalf("fill %q: %d bytes, truncated %v, note %v/%d, head %d bytes, %v", fill, len(b), truncated, note.Truncated, note.Bytes, len(note.Head), err)
		}
	}
	if b, truncated := bounded([]byte(`{"a":1}`), sandbox.MaxEventBytes); truncated || string(b) != `{"a":1}` {
		t.Fatalf("data within the bound changed: %s", b)
	}
}

// Bad input: a notification flood, while nobody reads the turn's events,
// does not grow the supervisor's memory without bound: the SDK's queue of
// notifications is bounded, the connection that overflows it is given up,
// the agent is stopped and the turn fails acp_connection_lost with only
// part of the flood delivered; the next turn loads the session into a new
// agent.
func TestACPNotificationFloodIsBounded(t *testing.T) {
	// The SDK goes on handling (and the supervisor dropping) what it had
	// queued of the given-up connection, on its own goroutines, within its
	// own bound: await them once the supervisor is stopped (cleanups run
	// last first), lest the package's leak check count them.
	t.Cleanup(func() { awaitNoGoroutine(t, "acp-go-sdk.(*Connection).processNotifications") })
	s := startServe(t, func(c *Config) { c.DrainTimeout = 200 * time.Millisecond })
	ctx := context.Background()
	act, p := acpPrepared(t, s.c, demoACP())
	const flood = 200000
	turn, err := s.c.RunACP(ctx, act.ID, "!flood "+strconv.Itoa(flood), sandbox.ACPOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nextEvent(t, turn) // the flood is on
	// Not reading: the supervisor's writes block, the SDK's queue fills.
	if err := testbin.WaitGone(p.PID, waitLimit); err != nil {
		t.Fatalf("the flooding agent was not stopped: %v", err)
	}
	evs, res := drain(t, turn)
	turn.Close()
	if res.Failure != sandbox.FailureACPConnection || len(evs) >= flood {
		t.Fatalf("result %+v after %d of %d updates; want %s with part of the flood", res, len(evs), flood, sandbox.FailureACPConnection)
	}
	if _, err := s.c.Settle(ctx, act.ID); err != nil {
		t.Fatal(err)
	}
	p2, evs, res := acpRun(t, s.c, demoACP(), "after the flood", sandbox.ACPOptions{})
	if !p2.Started || !p2.Loaded || res.StopReason != "end_turn" || !containsText(texts(t, evs), "echo: after the flood") {
		t.Fatalf("after the flood: prepare %+v, result %+v", p2, res)
	}
}

// awaitNoGoroutine polls the goroutines' stacks until none runs fn.
func awaitNoGoroutine(t *testing.T, fn string) {
	t.Helper()
	buf := make([]byte, 4<<20)
	for deadline := time.Now().Add(waitLimit); ; {
		n := runtime.Stack(buf, true)
		if !bytes.Contains(buf[:n], []byte(fn)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a goroutine still runs %s after %v", fn, waitLimit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// K13, A6: an ACP conversation's supervisor stopped (an idle eviction, a
// kill) and started again writes records that still carry the kept
// session id before its agent is prepared again. An activation after the
// restart that runs nothing (its turn cancelled before prepare) leaves the
// record the next activation presents: without the session id, a
// quarantined conversation verified on that record was lost with
// retained_receipt_mismatch although its session was kept (the chaos
// campaign's avoidable LOST, seed 741987723: a fenced turn, an idle stop,
// a cancelled turn, then the verifying one).
func TestACPRecordsKeepTheSessionAcrossARestart(t *testing.T) {
	dir := t.TempDir()
	ws, sock, state := filepath.Join(dir, "ws"), filepath.Join(dir, "s.sock"), filepath.Join(dir, "state")
	ctx := context.Background()
	c := &sandbox.Client{Socket: sock}
	agent := demoACP()

	p := startProc(t, ws, sock, "--state", state)
	acpRun(t, c, agent, "hello", sandbox.ACPOptions{})
	kept, err := loadACPSession(state)
	if err != nil || kept == nil || kept.SessionID == "" {
		t.Fatalf("kept session %+v, %v", kept, err)
	}
	p.kill()

	startProc(t, ws, sock, "--state", state)
	idle, err := c.Activate(ctx, 0) // its turn is cancelled before prepare: runs nothing
	if err != nil {
		t.Fatal(err)
	}
	next, err := c.Activate(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if p := next.Previous; p == nil || p.Activation != idle.ID || p.Ended != sandbox.EndedNotRun || p.ACPSession != kept.SessionID {
		t.Fatalf("the record after a restart and an activation that ran nothing: %+v; want it to name %s and carry session %q", p, idle.ID, kept.SessionID)
	}
	// And the session goes on: the agent is started again over it.
	prep, err := c.Prepare(ctx, next.ID, agent)
	if err != nil || !prep.Loaded {
		t.Fatalf("prepare after the restart: %+v, %v; want the kept session loaded", prep, err)
	}
}
