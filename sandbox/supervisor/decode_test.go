package supervisor

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/runnerd/runnerd/sandbox"
)

// FuzzReadRequest: any bytes on the socket give a request or a clear error,
// never a panic; an accepted request is of this protocol version.
func FuzzReadRequest(f *testing.F) {
	for _, s := range []string{
		`{"v":1,"op":"status"}` + "\n",
		`{"v":1,"op":"run","activation":"i.1.r","command":["/bin/agent","-x"],"prompt":"hi\n!events 3"}` + "\n",
		`{"v":1,"op":"settle","activation":"i.2.r"}` + "\n",
		`{"v":1,"op":"activate","lease_deadline":125000000000}` + "\n",
		`{"v":1,"op":"deadline","activation":"i.2.r","lease_deadline":155000000000}` + "\n",
		`{"v":1,"op":"deadline","activation":"i.2.r","lease_deadline":"soon"}` + "\n",
		`{"v":2,"op":"status"}` + "\n",
		`{"v":3,"op":"status"}` + "\n",
		`{"v":2,"op":"interrupt","activation":"i.2.r","grace_ms":3000}` + "\n",
		`{"v":1,"op":"status","x":1}` + "\n",
		`{"v":1,"op":"status"}{"v":1}` + "\n",
		"\xff\xfe\n",
		"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := readRequest(bytes.NewReader(b))
		if err == nil && (req.V < sandbox.Version1 || req.V > sandbox.ProtocolVersion) {
			t.Fatalf("accepted version %d", req.V)
		}
	})
}

// FuzzMakeEvent: any agent line becomes an event whose data is valid JSON
// and no larger than the line allows.
func FuzzMakeEvent(f *testing.F) {
	for _, s := range []string{
		`{"type":"message","native_turn":3,"text":"x"}`,
		`{"type":7,"native_turn":"x"}`,
		`plain text`,
		`{"unterminated":`,
		"\xff\xfe",
		"",
	} {
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, line []byte, truncated bool) {
		ev, nt := makeEvent(1, line, truncated)
		if !json.Valid(ev.Data) {
			t.Fatalf("data %q is not JSON", ev.Data)
		}
		if ev.Type == "" {
			t.Fatalf("type %q", ev.Type)
		}
		if truncated && nt != 0 {
			t.Fatal("a truncated line reported a native turn")
		}
		if len(ev.Data) > 6*len(line)+2 {
			t.Fatalf("data grew from %d to %d bytes", len(line), len(ev.Data))
		}
	})
}

func TestReadAgentLineCutsLongLines(t *testing.T) {
	in := strings.Repeat("a", 100) + "\nshort\n" + strings.Repeat("b", 30)
	r := bufio.NewReaderSize(strings.NewReader(in), 16)
	for _, want := range []struct {
		line      string
		truncated bool
		err       error
	}{
		{strings.Repeat("a", 40), true, nil},
		{"short", false, nil},
		{strings.Repeat("b", 30), false, io.EOF},
	} {
		line, truncated, err := readAgentLine(r, 40)
		if string(line) != want.line || truncated != want.truncated || !errors.Is(err, want.err) && err != want.err {
			t.Fatalf("got %q %v %v, want %q %v %v", line, truncated, err, want.line, want.truncated, want.err)
		}
	}
}

// A real agent writing a line over MaxEventBytes gets it cut to one
// truncated event, and the stream goes on.
func TestLongAgentLineIsTruncated(t *testing.T) {
	s := startServe(t)
	ctx := context.Background()
	act, err := s.c.Activate(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	script := `head -c 300000 /dev/zero | tr '\0' x; echo; echo '{"type":"after","native_turn":7}'`
	turn, err := s.c.Run(ctx, act.ID, []string{"sh", "-c", script}, "")
	if err != nil {
		t.Fatal(err)
	}
	defer turn.Close()
	evs, res := drain(t, turn)
	if len(evs) != 2 || evs[0].Type != "agent.output_truncated" || evs[1].Type != "after" {
		t.Fatalf("events %d: %+v", len(evs), evs)
	}
	var text string
	if err := json.Unmarshal(evs[0].Data, &text); err != nil || len(text) != sandbox.MaxEventBytes {
		t.Fatalf("truncated event carries %d bytes (%v), want %d", len(text), err, sandbox.MaxEventBytes)
	}
	if res.NativeTurn != 7 {
		t.Fatalf("native turn %d, want the agent's own 7", res.NativeTurn)
	}
}
