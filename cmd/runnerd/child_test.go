package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The daemon starts runnerd-child for process turns only when it lies
// beside runnerd and reports the same build; otherwise runnerd itself,
// saying why.
func TestChildExecutable(t *testing.T) {
	script := func(dir, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, childName), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, script, why string
		lean              bool
	}{
		{name: "absent", why: "no executable runnerd-child beside runnerd"},
		{name: "same build", script: "echo runnerd-child " + version, lean: true},
		{name: "other build", script: "echo runnerd-child v0.0.1-other", why: `reports "runnerd-child v0.0.1-other", not "runnerd-child ` + version + `"`},
		{name: "fails", script: "exit 3", why: "version: exit status 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			self := filepath.Join(dir, "runnerd")
			if tc.script != "" {
				script(dir, tc.script)
			}
			path, why := childExecutable(self)
			if tc.lean {
				if path != filepath.Join(dir, childName) || why != "" {
					t.Errorf("childExecutable = %q, %q; want runnerd-child", path, why)
				}
				return
			}
			if path != self || !strings.Contains(why, tc.why) {
				t.Errorf("childExecutable = %q, %q; want runnerd and a reason containing %q", path, why, tc.why)
			}
		})
	}
}
