package fleet

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The process backend's layout under a daemon's state directory (see
// package sandbox/process), read from outside as an operator would.

// SandboxDir is a conversation's process sandbox.
func SandboxDir(stateDir, conversationID string) string {
	return filepath.Join(stateDir, "sandboxes", conversationID)
}

// Workspace is the conversation's workspace, the demo agent's working directory.
func Workspace(stateDir, conversationID string) string {
	return filepath.Join(SandboxDir(stateDir, conversationID), "workspace")
}

// TranscriptEntry is one prompt the demo agent received.
type TranscriptEntry struct {
	Turn   int64  `json:"turn"`
	Prompt string `json:"prompt"`
}

// Transcript reads the demo agent's transcript of a conversation: every
// prompt that reached the agent, in order. No file means no prompt yet.
func Transcript(stateDir, conversationID string) ([]TranscriptEntry, error) {
	f, err := os.Open(filepath.Join(Workspace(stateDir, conversationID), ".demoagent", "transcript.jsonl"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []TranscriptEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		var e TranscriptEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("transcript of %s: %w", conversationID, err)
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

// SupervisorPid reads the pid the process backend recorded for the
// conversation's supervisor.
func SupervisorPid(stateDir, conversationID string) (int, error) {
	b, err := os.ReadFile(filepath.Join(SandboxDir(stateDir, conversationID), "supervisor.pid"))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}
