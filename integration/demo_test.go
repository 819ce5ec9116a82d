package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/volume"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/sandbox/docker"
)

// TestDemo runs `make demo`'s program on the binaries of this run, as the
// README's first command does: it exits 0, prints a row for each of the
// nine turns — all succeeded on one attempt, none released (the turn whose
// prompt says !decline-first too: no prompt decides a decline, K12), native
// turns 1, 2, 3 per conversation — and leaves no process behind. Then --dev: it comes up, prints the Admin → Servers
// address, which answers, and stops cleanly on SIGINT.
func TestDemo(t *testing.T) {
	t.Parallel()
	bins, tmp := privateBins(t)
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
		turn, outcome, attempts, released, native := r[2], r[3], r[4], r[5] != "", r[6]
		if outcome != "succeeded" || native != turn || released || attempts != "1" {
			t.Errorf("unexpected row: %q", r[0])
		}
	}
	if !strings.Contains(text, "runnerd drained and exited 0") || !strings.Contains(text, "All nine turns ended as expected") {
		t.Errorf("no clean shutdown or summary:\n%s", text)
	}
	if ps, _ := fleet.Procs(fleet.Executable(bins.Runnerd, bins.RunnerdChild), fleet.Under(tmp)); len(ps) > 0 {
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

// privateBins links the binaries into a directory of the test's own, so
// that the processes of this test's demo are told apart from every other
// test's by their executable, and returns them with the directory to use as
// TMPDIR. t.Cleanup stops whatever of them is left.
func privateBins(t *testing.T) (fleet.Binaries, string) {
	t.Helper()
	if bins.Demo == "" {
		t.Fatalf("no demo binary beside %s", bins.Runnerd)
	}
	dir := t.TempDir()
	binDir := filepath.Join(dir, "bin")
	if err := os.Mkdir(binDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{bins.Runnerd, bins.RunnerdChild, bins.ControlPlane, bins.DemoAgent, bins.Demo} {
		if p == "" {
			continue
		}
		if err := linkOrCopy(p, filepath.Join(binDir, filepath.Base(p))); err != nil {
			t.Fatal(err)
		}
	}
	own, err := fleet.BinariesIn(binDir)
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := fleet.StopProcs(5*time.Second, fleet.Executable(own.Runnerd, own.RunnerdChild), fleet.Under(tmp)); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return own, tmp
}

// TestDemoDocker runs `make demo SANDBOX=docker`'s program against the
// real engine: the demo agent's image is built FROM scratch, the nine
// turns run in three retained containers as expected, and afterwards no
// container or volume of the demo is left. It skips when no engine answers,
// unless RUNNERD_REQUIRE_DOCKER=1.
func TestDemoDocker(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	eng, err := docker.EngineFromEnv()
	if err == nil {
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = eng.Ping(pctx)
		pcancel()
	}
	if err != nil {
		if os.Getenv("RUNNERD_REQUIRE_DOCKER") == "1" {
			t.Fatalf("RUNNERD_REQUIRE_DOCKER=1 but no Docker engine answers: %v", err)
		}
		t.Skipf("no Docker engine answers (%v); set RUNNERD_REQUIRE_DOCKER=1 to make this a failure", err)
	}
	defer eng.Close()
	bins, tmp := privateBins(t)
	host := fmt.Sprintf("demo-test-%d", os.Getpid())
	cmd := exec.CommandContext(ctx, bins.Demo, "--bin", filepath.Dir(bins.Demo), "--sandbox", "docker", "--host-name", host)
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("demo --sandbox docker: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "All nine turns ended as expected") || !strings.Contains(string(out), "removed the 3 conversations' containers and volumes") {
		t.Errorf("unexpected output:\n%s", out)
	}
	// Everything the docker backend made is labelled with the host name.
	own := filters.NewArgs(filters.Arg("label", docker.LabelHost+"="+host))
	cs, err := eng.ContainerList(ctx, container.ListOptions{All: true, Filters: own})
	if err != nil {
		t.Fatal(err)
	}
	vs, err := eng.VolumeList(ctx, volume.ListOptions{Filters: own})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 0 || len(vs.Volumes) != 0 {
		t.Errorf("the demo left %d container(s) and %d volume(s) labelled %s", len(cs), len(vs.Volumes), host)
	}
}
