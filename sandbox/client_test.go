package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// Every sentinel crosses the socket as its code and comes back as itself.
func TestErrorCodesRoundTrip(t *testing.T) {
	for code, sentinel := range codeErrors {
		t.Run(code, func(t *testing.T) {
			reply := ReplyOf(errors.Join(sentinel))
			if reply.Code != code {
				t.Fatalf("code %q, want %q", reply.Code, code)
			}
			if err := replyError(OpRun, reply); !errors.Is(err, sentinel) {
				t.Fatalf("%v does not wrap %v", err, sentinel)
			}
		})
	}
	if got := ReplyOf(errors.New("something else")).Code; got != CodeProtocol {
		t.Fatalf("unknown error got code %q", got)
	}
	if err := replyError(OpRun, &ErrorReply{Code: "from the future"}); !errors.Is(err, ErrProtocol) {
		t.Fatalf("unknown code: %v", err)
	}
}

// A prompt too large for one message is refused before anything is sent:
// the client does not even dial (nothing listens here, so a dial would
// fail with ErrUnavailable), and the error is not ErrInterrupted.
func TestRunRefusesOversizePromptWithoutSending(t *testing.T) {
	c := &Client{Socket: filepath.Join(t.TempDir(), "nobody.sock")}
	_, err := c.Run(context.Background(), "a.1.x", []string{"agent"}, strings.Repeat("p", MaxMessageBytes))
	if !errors.Is(err, ErrProtocol) || errors.Is(err, ErrInterrupted) || errors.Is(err, ErrUnavailable) {
		t.Fatalf("oversize run: %v, want ErrProtocol only", err)
	}
	if _, err := c.Run(context.Background(), "a.1.x", []string{"agent"}, "small"); !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrInterrupted) {
		t.Fatalf("run with no supervisor: %v, want ErrUnavailable only", err)
	}
	if _, err := c.Run(context.Background(), "a.1.x", nil, "small"); !errors.Is(err, ErrProtocol) {
		t.Fatalf("run with no command: %v", err)
	}
}

func TestReadLineBounds(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		max      int
		want     string
		err      error
	}{
		{name: "one line", in: "abc\nrest", max: 10, want: "abc"},
		{name: "exactly at the limit", in: "abcdefghi\n", max: 10, want: "abcdefghi"},
		{name: "over the limit", in: "abcdefghijk\n", max: 10, err: ErrProtocol},
		{name: "cut short", in: "abc", max: 10, err: io.ErrUnexpectedEOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReadLine(bufio.NewReaderSize(strings.NewReader(tc.in), 16), tc.max)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil || string(got) != tc.want {
				t.Fatalf("got %q, %v", got, err)
			}
		})
	}
}

// FuzzReadResponse: any bytes from a supervisor decode to a response or a
// clear error, never a panic, and never more than MaxMessageBytes kept.
func FuzzReadResponse(f *testing.F) {
	for _, s := range []string{
		`{"status":{"id":"x","pid":1,"busy":false,"native_turn":2,"started_at":"2026-01-01T00:00:00Z"}}` + "\n",
		`{"event":{"seq":1,"time":"2026-01-01T00:00:00Z","type":"t","data":{"a":1}}}` + "\n",
		`{"end":{"exit_code":-1,"signal":"SIGKILL","native_turn":3}}` + "\n",
		`{"error":{"code":"fenced"}}` + "\n",
		`{"receipt":{"activation_id":"a","receipt_id":"r","native_turn":1,"exit_code":0}}` + "\n",
		"not json\n",
		"{\"event\":",
		"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bufio.NewReaderSize(bytes.NewReader(b), 64)
		for i := 0; i < 4; i++ {
			resp, err := readResponse(r)
			if err != nil {
				return
			}
			if resp.Error != nil {
				_ = replyError(OpRun, resp.Error)
			}
		}
	})
}

// oldSupervisor serves socket the way the first supervisors did (version 1,
// unversioned status): a request with a field version 1 does not know, or
// of another version, is refused. It returns the request lines it read.
func oldSupervisor(t *testing.T, socket string) func() []string {
	t.Helper()
	l, err := ListenUnix(socket)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		lines []string
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			line, err := ReadLine(bufio.NewReader(conn), MaxMessageBytes)
			if err != nil {
				conn.Close()
				continue
			}
			mu.Lock()
			lines = append(lines, string(line))
			mu.Unlock()
			var req struct {
				V          int      `json:"v"`
				Op         string   `json:"op"`
				Activation string   `json:"activation,omitempty"`
				Command    []string `json:"command,omitempty"`
				Prompt     string   `json:"prompt,omitempty"`
			}
			dec := json.NewDecoder(bytes.NewReader(line))
			dec.DisallowUnknownFields()
			answer := `{"error":{"code":"protocol"}}`
			if dec.Decode(&req) == nil && req.V == 1 {
				switch req.Op {
				case OpStatus:
					answer = `{"status":{"id":"old","pid":1,"busy":false,"native_turn":3,"started_at":"2026-01-01T00:00:00Z"}}`
				case OpActivate:
					answer = `{"activation":{"id":"i.1.x","native_turn":3}}`
				}
			}
			_, _ = conn.Write([]byte(answer + "\n"))
			conn.Close()
		}
	})
	t.Cleanup(func() { l.Close(); wg.Wait() })
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(lines)
	}
}

// A supervisor of an earlier release says no version: the client speaks
// version 1 to it and sends nothing it does not know — the lease deadline
// is left out of activate, deadline and interrupt fail with ErrOutdated
// without a request. At this build's version the same supervisor refuses
// the activation (the peer is as strict as the old supervisors were).
func TestClientSpeaksTheSupervisorsVersion(t *testing.T) {
	ctx := context.Background()
	sock := filepath.Join(t.TempDir(), "old.sock")
	seen := oldSupervisor(t, sock)

	st, err := (&Client{Socket: sock}).Status(ctx)
	if err != nil || st.Version != Version1 {
		t.Fatalf("status of an unversioned supervisor: %+v, %v; want version 1", st, err)
	}
	if _, err := (&Client{Socket: sock}).Activate(ctx, 125_000_000_000); !errors.Is(err, ErrProtocol) {
		t.Fatalf("activate at version %d: %v, want the old supervisor's refusal", ProtocolVersion, err)
	}
	c := &Client{Socket: sock, Version: st.Version}
	act, err := c.Activate(ctx, 125_000_000_000)
	if err != nil || act.ID != "i.1.x" || act.Previous != nil {
		t.Fatalf("activate at version 1: %+v, %v", act, err)
	}
	before := len(seen())
	if err := c.SetDeadline(ctx, act.ID, 155_000_000_000); !errors.Is(err, ErrOutdated) {
		t.Fatalf("deadline at version 1: %v, want ErrOutdated", err)
	}
	if _, err := c.Interrupt(ctx, act.ID, 0); !errors.Is(err, ErrOutdated) {
		t.Fatalf("interrupt at version 1: %v, want ErrOutdated", err)
	}
	if got := seen(); len(got) != before {
		t.Fatalf("requests sent for operations version 1 lacks: %q", got[before:])
	}
	for _, line := range seen() {
		if strings.Contains(line, "lease_deadline") && strings.Contains(line, `"v":1`) {
			t.Fatalf("a version 1 request carried the lease deadline: %s", line)
		}
	}
}
