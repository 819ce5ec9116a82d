package integration

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runnerd/runnerd/integration/fleet"
)

// TestDemo runs `make demo`'s program on the binaries of this run, as the
// README's first command does: it exits 0, prints a row for each of the
// nine turns — all succeeded, the !decline-first turn on two attempts with
// one released, native turns 1, 2, 3 per conversation — and leaves no
// process behind. Then --dev: it comes up, prints the Admin → Servers
// address, which answers, and stops cleanly on SIGINT.
func TestDemo(t *testing.T) {
	t.Parallel()
	if bins.Demo == "" {
		t.Fatalf("no demo binary beside %s", bins.Runnerd)
	}
	tmp := t.TempDir()
	t.Cleanup(func() {
		if _, err := fleet.StopProcs(bins.Runnerd, tmp, 5*time.Second); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	env := append(os.Environ(), "TMPDIR="+tmp)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	cmd := exec.CommandContext(ctx, bins.Demo, "--bin", filepath.Dir(bins.Demo))
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	text := out.String()
	rows := regexp.MustCompile(`(?m)^(alpha|bravo|charlie) +(\d) +(\S+) +(\d)( \(1 released\))? +[\d.]+s +(\d) `).FindAllStringSubmatch(text, -1)
	if len(rows) != 9 {
		t.Fatalf("want nine rows of turns, got %d:\n%s", len(rows), text)
	}
	for _, r := range rows {
		conv, turn, outcome, attempts, released, native := r[1], r[2], r[3], r[4], r[5] != "", r[6]
		declined := conv == "alpha" && turn == "2"
		if outcome != "succeeded" || native != turn || declined != released || declined != (attempts == "2") {
			t.Errorf("unexpected row: %q", r[0])
		}
	}
	if !strings.Contains(text, "runnerd drained and exited 0") || !strings.Contains(text, "All nine turns ended as expected") {
		t.Errorf("no clean shutdown or summary:\n%s", text)
	}
	if ps, _ := fleet.Procs(bins.Runnerd, tmp); len(ps) > 0 {
		t.Errorf("the demo left processes behind: %v", ps)
	}

	dev := exec.CommandContext(ctx, bins.Demo, "--bin", filepath.Dir(bins.Demo), "--dev", "--listen", "127.0.0.1:0")
	dev.Env = env
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	dev.Stdout, dev.Stderr = pw, pw
	if err := dev.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	devDone := make(chan error, 1)
	go func() { devDone <- dev.Wait() }()
	t.Cleanup(func() {
		_ = dev.Process.Kill()
		<-devDone
	})
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		defer pr.Close()
		var buf bytes.Buffer
		b := make([]byte, 4096)
		for {
			n, err := pr.Read(b)
			buf.Write(b[:n])
			for {
				line, rest, ok := strings.Cut(buf.String(), "\n")
				if !ok {
					break
				}
				lines <- line
				buf.Reset()
				buf.WriteString(rest)
			}
			if err != nil {
				return
			}
		}
	}()
	admin := regexp.MustCompile(`Admin → Servers: (http://\S+)/admin/servers .*token in (\S+)\)`)
	var m []string
	for m == nil {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("demo --dev ended before printing the Admin → Servers address")
			}
			m = admin.FindStringSubmatch(line)
		case <-ctx.Done():
			t.Fatal("demo --dev printed no Admin → Servers address")
		}
	}
	tok, err := os.ReadFile(m[2])
	if err != nil {
		t.Fatal(err)
	}
	u := fleet.NewUser(m[1], strings.TrimSpace(string(tok)))
	defer u.Close()
	if s, ok, err := u.Server(ctx, "demo-host"); err != nil || !ok || s.LastHeartbeat == nil {
		t.Errorf("Admin → Servers does not show the demo host heartbeating: %+v %v %v", s, ok, err)
	}
	_ = dev.Process.Signal(syscall.SIGINT)
	for range lines {
	}
	if err := <-devDone; err != nil {
		t.Errorf("demo --dev after SIGINT: %v", err)
	}
	devDone <- nil // for the cleanup
}
