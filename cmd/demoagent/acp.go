package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coder/acp-go-sdk"
)

// With --acp the demo agent speaks the Agent Client Protocol on its stdio
// (the SDK's agent side): one process for the conversation, one session
// (its id kept in .demoagent/acp_session), and per session/prompt the same
// native session as the line protocol — the prompt appended to the
// transcript and the turn ordinal moved on, before anything else. Its
// output is session/update notifications instead of JSON lines.
//
// Flags, for the tests of the client side:
//
//	--no-load-session   do not advertise loadSession
//	--init=hang         never answer initialize
//	--init=exit         exit while asked to initialize
//	--init=garbage      write a malformed JSON-RPC line before answering
//
// Directives of the prompt, beside !events N, !sleep D and !silent D (both
// silent, ending early on session/cancel), !crash and !hang (which ignores
// session/cancel):
//
//	!stop REASON      end the turn with that stop reason (max_tokens, refusal, …)
//	!error            answer session/prompt with a JSON-RPC error
//	!permission [N]   ask for permission (allow / reject options) and say which was chosen;
//	                  with N, the tool call's title is N bytes longer
//	!write PATH TEXT  fs/write_text_file PATH with TEXT, and say how it went
//	!read PATH        fs/read_text_file PATH, and say how it went
//	!big N            one agent_message_chunk of N bytes
//	!garbage          write a malformed JSON-RPC line
//	!flood N          N agent_message_chunk notifications as fast as possible
//	!unknown          call an unknown method, an extension method and terminal/create
//	!orphan           write a JSON-RPC response to an id the client never sent

type acpDemo struct {
	conn        *acp.AgentSideConnection
	out         *lockedWriter
	dir         string
	loadSession bool
	initMode    string

	mu      sync.Mutex // guards session and cancel
	session string
	cancel  context.CancelFunc
}

// lockedWriter lets !garbage write a raw line between the SDK's messages.
type lockedWriter struct {
	mu sync.Mutex // guards w
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

func runACP(args []string) int {
	d := &acpDemo{dir: ".demoagent", loadSession: true, out: &lockedWriter{w: os.Stdout}}
	for _, a := range args {
		switch {
		case a == "--acp":
		case a == "--no-load-session":
			d.loadSession = false
		case strings.HasPrefix(a, "--init="):
			d.initMode = strings.TrimPrefix(a, "--init=")
		default:
			fmt.Fprintln(os.Stderr, "demoagent: unknown flag", a)
			return 2
		}
	}
	d.conn = acp.NewAgentSideConnection(d, d.out, os.Stdin)
	<-d.conn.Done()
	return 0
}

var _ acp.AgentLoader = (*acpDemo)(nil)

func (d *acpDemo) Initialize(ctx context.Context, _ acp.InitializeRequest) (acp.InitializeResponse, error) {
	switch d.initMode {
	case "hang":
		<-ctx.Done()
		select {}
	case "exit":
		os.Exit(3)
	case "garbage":
		_, _ = d.out.Write([]byte("{this is not json-rpc\n"))
	}
	return acp.InitializeResponse{
		ProtocolVersion:   acp.ProtocolVersionNumber,
		AgentCapabilities: acp.AgentCapabilities{LoadSession: d.loadSession},
		AgentInfo:         &acp.Implementation{Name: "demoagent", Version: "1"},
	}, nil
}

func (d *acpDemo) Authenticate(context.Context, acp.AuthenticateRequest) (acp.AuthenticateResponse, error) {
	return acp.AuthenticateResponse{}, nil
}

func (d *acpDemo) NewSession(context.Context, acp.NewSessionRequest) (acp.NewSessionResponse, error) {
	if err := os.MkdirAll(d.dir, 0o755); err != nil {
		return acp.NewSessionResponse{}, err
	}
	id := fmt.Sprintf("demo-%d-%d", os.Getpid(), time.Now().UnixNano())
	if err := os.WriteFile(filepath.Join(d.dir, "acp_session"), []byte(id+"\n"), 0o644); err != nil {
		return acp.NewSessionResponse{}, err
	}
	d.mu.Lock()
	d.session = id
	d.mu.Unlock()
	return acp.NewSessionResponse{SessionId: acp.SessionId(id)}, nil
}

// LoadSession takes the kept session back and replays its history (the
// prompts of the transcript) as user_message_chunk updates, as ACP asks.
func (d *acpDemo) LoadSession(ctx context.Context, p acp.LoadSessionRequest) (acp.LoadSessionResponse, error) {
	b, err := os.ReadFile(filepath.Join(d.dir, "acp_session"))
	if err != nil || strings.TrimSpace(string(b)) != string(p.SessionId) {
		return acp.LoadSessionResponse{}, acp.NewInvalidParams(map[string]any{"error": "no such session"})
	}
	d.mu.Lock()
	d.session = string(p.SessionId)
	d.mu.Unlock()
	if f, err := os.Open(filepath.Join(d.dir, "transcript.jsonl")); err == nil {
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 16<<20)
		for sc.Scan() {
			var e struct {
				Prompt string `json:"prompt"`
			}
			if json.Unmarshal(sc.Bytes(), &e) == nil {
				_ = d.conn.SessionUpdate(ctx, acp.SessionNotification{SessionId: p.SessionId, Update: acp.UpdateUserMessageText(e.Prompt)})
			}
		}
		f.Close()
	}
	return acp.LoadSessionResponse{}, nil
}

func (d *acpDemo) Cancel(context.Context, acp.CancelNotification) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cancel != nil {
		d.cancel()
	}
	return nil
}

func (d *acpDemo) CloseSession(context.Context, acp.CloseSessionRequest) (acp.CloseSessionResponse, error) {
	return acp.CloseSessionResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionClose)
}

func (d *acpDemo) ListSessions(context.Context, acp.ListSessionsRequest) (acp.ListSessionsResponse, error) {
	return acp.ListSessionsResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionList)
}

func (d *acpDemo) ResumeSession(context.Context, acp.ResumeSessionRequest) (acp.ResumeSessionResponse, error) {
	return acp.ResumeSessionResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionResume)
}

func (d *acpDemo) SetSessionConfigOption(context.Context, acp.SetSessionConfigOptionRequest) (acp.SetSessionConfigOptionResponse, error) {
	return acp.SetSessionConfigOptionResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionSetConfigOption)
}

func (d *acpDemo) SetSessionMode(context.Context, acp.SetSessionModeRequest) (acp.SetSessionModeResponse, error) {
	return acp.SetSessionModeResponse{}, nil
}

func (d *acpDemo) say(ctx context.Context, sid acp.SessionId, text string) {
	_ = d.conn.SessionUpdate(ctx, acp.SessionNotification{SessionId: sid, Update: acp.UpdateAgentMessageText(text)})
}

func (d *acpDemo) Prompt(_ context.Context, p acp.PromptRequest) (acp.PromptResponse, error) {
	d.mu.Lock()
	if string(p.SessionId) != d.session {
		d.mu.Unlock()
		return acp.PromptResponse{}, acp.NewInvalidParams(map[string]any{"error": "unknown session"})
	}
	ctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	d.mu.Unlock()
	defer cancel()
	var prompt strings.Builder
	for _, b := range p.Prompt {
		if b.Text != nil {
			prompt.WriteString(b.Text.Text)
		}
	}
	turn, err := advance(d.dir, prompt.String())
	if err != nil {
		return acp.PromptResponse{}, acp.NewInternalError(map[string]any{"error": err.Error()})
	}
	sid := p.SessionId
	d.say(ctx, sid, fmt.Sprintf("turn %d", turn))
	stop := acp.StopReasonEndTurn
	var text []string
	for _, line := range strings.Split(prompt.String(), "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "!") {
			if line != "" {
				text = append(text, line)
			}
			continue
		}
		verb, arg, _ := strings.Cut(line[1:], " ")
		arg = strings.TrimSpace(arg)
		switch verb {
		case "events", "flood":
			n, _ := strconv.Atoi(arg)
			for i := 1; i <= n; i++ {
				d.say(ctx, sid, fmt.Sprintf("delta %d of %d", i, n))
			}
		case "sleep", "silent":
			dur, _ := time.ParseDuration(arg)
			select {
			case <-time.After(dur):
			case <-ctx.Done():
				return acp.PromptResponse{StopReason: acp.StopReasonCancelled}, nil
			}
		case "hang":
			select {}
		case "crash":
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		case "stop":
			stop = acp.StopReason(arg)
		case "error":
			return acp.PromptResponse{}, acp.NewInternalError(map[string]any{"error": "asked to fail"})
		case "permission":
			resp, err := d.conn.RequestPermission(ctx, acp.RequestPermissionRequest{
				SessionId: sid,
				ToolCall:  acp.ToolCallUpdate{ToolCallId: "demo_call", Title: acp.Ptr("Write a file" + pad(arg))},
				Options: []acp.PermissionOption{
					{Kind: acp.PermissionOptionKindAllowOnce, Name: "Allow", OptionId: "yes"},
					{Kind: acp.PermissionOptionKindRejectOnce, Name: "Reject", OptionId: "no"},
				},
			})
			switch {
			case err != nil:
				d.say(ctx, sid, "permission: error")
			case resp.Outcome.Selected != nil:
				d.say(ctx, sid, "permission: "+string(resp.Outcome.Selected.OptionId))
			default:
				d.say(ctx, sid, "permission: cancelled")
			}
		case "write":
			path, content, _ := strings.Cut(arg, " ")
			_, err := d.conn.WriteTextFile(ctx, acp.WriteTextFileRequest{SessionId: sid, Path: d.abs(path), Content: content})
			d.say(ctx, sid, "write "+path+": "+errText(err))
		case "read":
			resp, err := d.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: sid, Path: d.abs(arg)})
			if err == nil {
				d.say(ctx, sid, "read "+arg+": "+resp.Content)
			} else {
				d.say(ctx, sid, "read "+arg+": "+errText(err))
			}
		case "big":
			n, _ := strconv.Atoi(arg)
			d.say(ctx, sid, strings.Repeat("x", n))
		case "garbage":
			_, _ = d.out.Write([]byte("{\"jsonrpc\":\"2.0\", garbage\n"))
		case "unknown":
			// A request of a method ACP does not have (its answer, to an
			// id the SDK did not send, is dropped here), an extension
			// method and a terminal, which the client does not serve.
			_, _ = d.out.Write([]byte(`{"jsonrpc":"2.0","id":"demo-unknown","method":"no/such_method","params":{}}` + "\n"))
			_, err := d.conn.CallExtension(ctx, "_demoagent/unknown", map[string]any{})
			d.say(ctx, sid, "extension: "+errText(err))
			_, err = d.conn.CreateTerminal(ctx, acp.CreateTerminalRequest{SessionId: sid, Command: "sh"})
			d.say(ctx, sid, "terminal: "+errText(err))
		case "orphan":
			_, _ = d.out.Write([]byte(`{"jsonrpc":"2.0","id":987654321,"result":{"stopReason":"end_turn"}}` + "\n"))
		default:
			d.say(ctx, sid, "unknown directive "+line)
		}
	}
	if len(text) > 0 {
		d.say(ctx, sid, "echo: "+strings.Join(text, " "))
	}
	if ctx.Err() != nil {
		return acp.PromptResponse{StopReason: acp.StopReasonCancelled}, nil
	}
	return acp.PromptResponse{StopReason: stop}, nil
}

// abs makes a relative path absolute against the working directory (the
// workspace); an absolute one is kept, so tests can name paths outside.
func (d *acpDemo) abs(p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	wd, _ := os.Getwd()
	return wd + "/" + p
}

// pad is arg's number of bytes of padding.
func pad(arg string) string {
	n, _ := strconv.Atoi(arg)
	return strings.Repeat("p", max(n, 0))
}

func errText(err error) string {
	if err == nil {
		return "ok"
	}
	var re *acp.RequestError
	if errors.As(err, &re) {
		return fmt.Sprintf("refused %d", re.Code)
	}
	return "error"
}
