package supervisor

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/internal/testbin"
)

// demoAgent is the path of the demo agent built by TestMain.
var demoAgent string

// TestMain re-enters the test binary as "supervise" (the way runnerd is
// re-entered) for the tests that need a real supervisor process to kill and
// restart; otherwise it builds the demo agent and runs the tests.
func TestMain(m *testing.M) {
	testbin.Main(m, &demoAgent, map[string]func([]string) int{
		"supervise": superviseMain,
	})
}

func superviseMain(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return Main(ctx, args, os.Stderr)
}

const waitLimit = 20 * time.Second

// recorder is a slog handler that lets a test wait for a record by name.
type recorder struct {
	mu      sync.Mutex
	msgs    []string
	recs    []slog.Record // clones, in the order of msgs
	changed chan struct{}
}

// attrs returns the attributes of every record msg logged so far.
func (r *recorder) attrs(msg string) []map[string]slog.Value {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []map[string]slog.Value
	for _, rec := range r.recs {
		if rec.Message != msg {
			continue
		}
		m := map[string]slog.Value{}
		rec.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value; return true })
		out = append(out, m)
	}
	return out
}

func newRecorder() *recorder { return &recorder{changed: make(chan struct{})} }

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *recorder) WithGroup(string) slog.Handler            { return r }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, rec.Message)
	r.recs = append(r.recs, rec.Clone())
	close(r.changed)
	r.changed = make(chan struct{})
	return nil
}

// count is how many times the record msg has been logged so far.
func (r *recorder) count(msg string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, m := range r.msgs {
		if m == msg {
			n++
		}
	}
	return n
}

// waitFor waits until the record msg has been logged n times.
func (r *recorder) waitFor(t *testing.T, msg string, n int) {
	t.Helper()
	timeout := time.After(waitLimit)
	for {
		r.mu.Lock()
		count := 0
		for _, m := range r.msgs {
			if m == msg {
				count++
			}
		}
		ch := r.changed
		r.mu.Unlock()
		if count >= n {
			return
		}
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("record %s not seen %d times within %v", msg, n, waitLimit)
		}
	}
}

type sup struct {
	ws, sock string
	rec      *recorder
	c        *sandbox.Client
}

// startServe runs a supervisor in this process (so the race detector sees
// it) and returns once it listens.
func startServe(t testing.TB, opts ...func(*Config)) *sup {
	t.Helper()
	dir := t.TempDir()
	s := &sup{ws: filepath.Join(dir, "workspace"), sock: filepath.Join(dir, "s.sock"), rec: newRecorder()}
	s.c = &sandbox.Client{Socket: s.sock}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	cfg := Config{
		Socket:    s.sock,
		Workspace: s.ws,
		ID:        "test-sandbox",
		Logger:    slog.New(s.rec),
		Ready:     func() { close(ready) },
	}
	for _, o := range opts {
		o(&cfg)
	}
	go func() { done <- Serve(ctx, cfg) }()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("serve: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return s
}

// proc is a supervisor running as its own process (the test binary
// re-entered as "supervise").
type proc struct {
	cmd    *exec.Cmd
	stderr *bytes.Buffer
	lines  *lineWaiter
}

// startProc starts a supervisor process over ws and sock and returns once
// it listens (it says so on its ready pipe).
func startProc(t *testing.T, ws, sock string, extra ...string) *proc {
	t.Helper()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{stderr: &bytes.Buffer{}, lines: &lineWaiter{changed: make(chan struct{})}}
	args := append([]string{"supervise", "--socket", sock, "--workspace", ws, "--id", "proc-sandbox", "--ready-fd", "3"}, extra...)
	p.cmd = exec.Command(os.Args[0], args...)
	p.cmd.ExtraFiles = []*os.File{pw}
	p.cmd.Stderr = &lockedWriter{w: p.stderr, lines: p.lines}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	line, _ := bufio.NewReader(pr).ReadString('\n')
	pr.Close()
	if line != "ready\n" {
		p.kill()
		t.Fatalf("supervisor did not become ready; stderr:\n%s", p.stderr)
	}
	t.Cleanup(p.kill)
	return p
}

// kill kills the supervisor process with SIGKILL and reaps it.
func (p *proc) kill() {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
}

// lockedWriter keeps the supervisor's stderr and tells lines what it got.
type lockedWriter struct {
	mu    sync.Mutex
	w     io.Writer
	lines *lineWaiter
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines.add(b)
	return l.w.Write(b)
}

// lineWaiter lets a test wait for text in a process's stderr.
type lineWaiter struct {
	mu      sync.Mutex
	text    []byte
	changed chan struct{}
}

func (w *lineWaiter) add(b []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.text = append(w.text, b...)
	close(w.changed)
	w.changed = make(chan struct{})
}

// contains reports whether the process's stderr holds substr so far.
func (w *lineWaiter) contains(substr string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return bytes.Contains(w.text, []byte(substr))
}

func (w *lineWaiter) waitFor(t *testing.T, substr string) {
	t.Helper()
	timeout := time.After(waitLimit)
	for {
		w.mu.Lock()
		found := bytes.Contains(w.text, []byte(substr))
		ch := w.changed
		w.mu.Unlock()
		if found {
			return
		}
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("%q not in the supervisor's stderr within %v", substr, waitLimit)
		}
	}
}

// drain reads a turn to its end and returns its events.
func drain(t *testing.T, turn *sandbox.Turn) ([]sandbox.Event, sandbox.Result) {
	t.Helper()
	var evs []sandbox.Event
	for {
		ev, err := turn.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("turn: %v", err)
		}
		evs = append(evs, ev)
	}
	res, err := turn.Result()
	if err != nil {
		t.Fatalf("result: %v", err)
	}
	return evs, res
}

// runTurn activates, runs prompt to its end and settles.
func runTurn(t *testing.T, c *sandbox.Client, prompt string) (sandbox.Activation, []sandbox.Event, sandbox.Result) {
	t.Helper()
	ctx := context.Background()
	act, err := c.Activate(ctx, 0)
	if err != nil {
		t.Fatalf("activate: %v", err)
	}
	turn, err := c.Run(ctx, act.ID, []string{demoAgent}, prompt)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	defer turn.Close()
	evs, res := drain(t, turn)
	return act, evs, res
}

// nextEvent reads one event, failing the test on an error.
func nextEvent(t *testing.T, turn *sandbox.Turn) sandbox.Event {
	t.Helper()
	ev, err := turn.Next()
	if err != nil {
		t.Fatalf("next event: %v", err)
	}
	return ev
}

// streamEnd reads a turn until its stream ends and returns what ended it.
func streamEnd(turn *sandbox.Turn) error {
	for {
		if _, err := turn.Next(); err != nil {
			return err
		}
	}
}

// eventField decodes one field of an event's data.
func eventField[T any](t *testing.T, ev sandbox.Event, name string) T {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(ev.Data, &m); err != nil {
		t.Fatalf("event data %s: %v", ev.Data, err)
	}
	var v T
	if err := json.Unmarshal(m[name], &v); err != nil {
		t.Fatalf("event field %s of %s: %v", name, ev.Data, err)
	}
	return v
}

// transcript returns the prompts the demo agent received, in order.
func transcript(t *testing.T, ws string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(ws, ".demoagent", "transcript.jsonl"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var e struct {
			Prompt string `json:"prompt"`
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatal(err)
		}
		out = append(out, e.Prompt)
	}
	return out
}
