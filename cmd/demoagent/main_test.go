package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	// Five turns ran in one session: the ordinal continued and every prompt
	// is in the transcript once.
	b, err := os.ReadFile(filepath.Join(dir, ".demoagent", "turn"))
	if err != nil || strings.TrimSpace(string(b)) != "5" {
		t.Fatalf("turn file %q, %v", b, err)
	}
	tr, err := os.ReadFile(filepath.Join(dir, ".demoagent", "transcript.jsonl"))
	if err != nil || strings.Count(string(tr), "\n") != 5 {
		t.Fatalf("transcript %q, %v", tr, err)
	}
}
