package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/internal/syncbuf"
)

func events(t *testing.T, out string) []map[string]any {
	t.Helper()
	var evs []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var ev map[string]any
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("line %q is not JSON: %v", line, err)
		}
		evs = append(evs, ev)
	}
	return evs
}

func TestDirectivesAndSessionContinue(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, prompt string
		end          ending
		types        []string
	}{
		{"events", "hi\n!events 2", ending{}, []string{"turn.started", "message.delta", "message.delta", "message", "turn.completed"}},
		{"exit", "!exit 3\n!events 1", ending{code: 3}, []string{"turn.started"}},
		{"crash", "!crash", ending{crash: true}, []string{"turn.started"}},
		{"hang", "!hang", ending{hang: true}, []string{"turn.started", "status"}},
		{"sleep", "!sleep 1ms\n!silent 1ms\n!bogus", ending{}, []string{"turn.started", "status", "unknown_directive", "turn.completed"}},
		{"await outside", "!await /etc\n!await ../x", ending{}, []string{"turn.started", "unknown_directive", "unknown_directive", "turn.completed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			if got := run(strings.NewReader(tc.prompt), &out, dir); got != tc.end {
				t.Fatalf("ending %+v, want %+v", got, tc.end)
			}
			evs := events(t, out.String())
			if len(evs) != len(tc.types) {
				t.Fatalf("events %v, want types %v", evs, tc.types)
			}
			for i, ev := range evs {
				if ev["type"] != tc.types[i] {
					t.Errorf("event %d type %v, want %s", i, ev["type"], tc.types[i])
				}
			}
		})
	}
	// Six turns ran in one session: the ordinal continued and every prompt
	// is in the transcript once.
	b, err := os.ReadFile(filepath.Join(dir, ".demoagent", "turn"))
	if err != nil || strings.TrimSpace(string(b)) != "6" {
		t.Fatalf("turn file %q, %v", b, err)
	}
	tr, err := os.ReadFile(filepath.Join(dir, ".demoagent", "transcript.jsonl"))
	if err != nil || strings.Count(string(tr), "\n") != 6 {
		t.Fatalf("transcript %q, %v", tr, err)
	}
}

// !await lasts until the test creates its file: a turn that outlives
// whatever the test does meanwhile (a restart, a crash), on any machine.
func TestAwaitLastsUntilReleased(t *testing.T) {
	dir := t.TempDir()
	out := &syncbuf.Buffer{}
	done := make(chan ending, 1)
	go func() { done <- run(strings.NewReader("!await release\n!events 1"), out, dir) }()
	for !strings.Contains(out.String(), `"awaiting release"`) {
		select {
		case end := <-done:
			t.Fatalf("the turn ended (%+v) without awaiting its file: %s", end, out)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if strings.Contains(out.String(), `"turn.completed"`) {
		t.Fatalf("the turn went on before its file was made: %s", out)
	}
	if err := os.WriteFile(filepath.Join(dir, "release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	end := <-done
	if end != (ending{}) || !strings.Contains(out.String(), `"message.delta"`) || !strings.Contains(out.String(), `"turn.completed"`) {
		t.Fatalf("after the release: %+v, %s", end, out)
	}
}
