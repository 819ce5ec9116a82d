package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// `runnerd drain` signals only a `runnerd run`: with no pid file, or one
// whose pid is some other program (a stale file's pid reused — here the
// test binary itself, which would die of SIGUSR1's default), it says so and
// exits 1 without sending anything.
func TestDrainFindsOnlyADaemon(t *testing.T) {
	dir := t.TempDir()
	getenv := func(string) string { return "" }
	var out, errb bytes.Buffer
	if code := runDrain([]string{"--state-dir", dir}, getenv, &out, &errb); code != 1 || !strings.Contains(errb.String(), "no runnerd runs on "+dir+" (no runnerd.pid)") {
		t.Errorf("no pid file: exit %d, %q", code, errb.String())
	}
	if err := os.WriteFile(filepath.Join(dir, pidFile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	errb.Reset()
	if code := runDrain(nil, func(k string) string { return map[string]string{"RUNNERD_STATE_DIR": dir}[k] }, &out, &errb); code != 1 || !strings.Contains(errb.String(), "is not runnerd run") {
		t.Errorf("a pid that is not runnerd run: exit %d, %q", code, errb.String())
	}
	if code := runDrain([]string{"--state-dir", dir, "extra"}, getenv, &out, &errb); code != 2 {
		t.Errorf("an extra argument: exit %d, want 2", code)
	}
}
