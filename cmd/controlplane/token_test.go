package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/runnerd/runnerd/controlplane/store/sqlstore/sqltest"
	"github.com/runnerd/runnerd/internal/syncbuf"
)

// replica is one `controlplane serve` run by the test; stop ends it (and
// so does the end of the test).
type replica struct {
	addr string
	logs *syncbuf.Buffer
	stop func()
}

// startServe runs serve with args and returns once it serves, with the
// lines it printed at start (the token's among them) in logs.
func startServe(t *testing.T, args ...string) *replica {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	served := make(chan int, 1)
	go func() {
		served <- run(ctx, append([]string{"serve", "--listen", "127.0.0.1:0"}, args...), noEnv, io.Discard, pw)
		pw.Close()
	}()
	r := &replica{logs: &syncbuf.Buffer{}}
	sc := bufio.NewScanner(pr)
	for r.addr == "" || !strings.Contains(r.logs.String(), "admin page") {
		if !sc.Scan() {
			cancel()
			t.Fatalf("serve stopped before it served (exit %d):\n%s", <-served, r.logs.String())
		}
		r.logs.Write([]byte(sc.Text() + "\n"))
		if _, addr, ok := strings.Cut(sc.Text(), "serving "); ok && r.addr == "" {
			r.addr, _, _ = strings.Cut(addr, " ")
		}
	}
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for sc.Scan() {
			r.logs.Write([]byte(sc.Text() + "\n"))
		}
	}()
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			cancel()
			if code := <-served; code != exitOK {
				t.Errorf("serve exit %d\n%s", code, r.logs.String())
			}
			<-drained
		})
	}
	t.Cleanup(r.stop)
	return r
}

// status is the answer of GET /v1/conversations with token.
func (r *replica) status(t *testing.T, token string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, r.addr+"/v1/conversations", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// Two replicas on one PostgreSQL database accept the same user tokens: the
// token the first start wrote to replica 1's file, and one made with
// `token create`; `token revoke` refuses a token on both at once. The
// second replica, finding tokens in the database, writes no file of its
// own. No token reaches any output but the one that hands it out.
func TestUserTokensSharedByReplicas(t *testing.T) {
	dsn := sqltest.PostgresSchema(t)
	dir1, dir2 := t.TempDir(), t.TempDir()
	r1 := startServe(t, "--db", dsn, "--data-dir", dir1)
	r2 := startServe(t, "--db", dsn, "--data-dir", dir2)
	first, err := os.ReadFile(filepath.Join(dir1, "user-token"))
	if err != nil {
		t.Fatalf("the first start wrote no user token file: %v", err)
	}
	firstToken := strings.TrimSpace(string(first))
	if _, err := os.Stat(filepath.Join(dir2, "user-token")); !os.IsNotExist(err) {
		t.Fatalf("the second replica wrote a token file of its own: %v", err)
	}
	if !strings.Contains(r2.logs.String(), "user tokens are in the database") {
		t.Fatalf("the second replica does not say where the tokens are:\n%s", r2.logs.String())
	}

	code, stdout, stderr := runCmd(t, noEnv, "token", "create", "ci", "--db", dsn)
	if code != exitOK {
		t.Fatalf("token create: exit %d %s", code, stderr)
	}
	made := strings.TrimSpace(stdout)
	if !strings.HasPrefix(made, "rdu_") || strings.Contains(stderr, made) {
		t.Fatalf("token create printed %q, stderr %q", stdout, stderr)
	}
	for _, tok := range []string{firstToken, made} {
		for i, r := range []*replica{r1, r2} {
			if got := r.status(t, tok); got != http.StatusOK {
				t.Fatalf("replica %d answers a shared user token with %d", i+1, got)
			}
		}
	}
	if got := r2.status(t, "rdu_nobody"); got != http.StatusUnauthorized {
		t.Fatalf("an unknown token: %d", got)
	}

	code, stdout, stderr = runCmd(t, noEnv, "token", "list", "--db", dsn)
	if code != exitOK || !strings.Contains(stdout, "first start") || !strings.Contains(stdout, "ci") {
		t.Fatalf("token list: exit %d\n%s%s", code, stdout, stderr)
	}
	var id string
	for _, line := range strings.Split(stdout, "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[1] == "ci" {
			id = f[0]
		}
	}
	if code, _, stderr = runCmd(t, noEnv, "token", "revoke", id, "--db", dsn); code != exitOK {
		t.Fatalf("token revoke %s: exit %d %s", id, code, stderr)
	}
	for i, r := range []*replica{r1, r2} {
		if got := r.status(t, made); got != http.StatusUnauthorized {
			t.Fatalf("replica %d answers a revoked token with %d", i+1, got)
		}
		if got := r.status(t, firstToken); got != http.StatusOK {
			t.Fatalf("replica %d refuses the token that was not revoked: %d", i+1, got)
		}
	}
	code, stdout, _ = runCmd(t, noEnv, "token", "list", "--db", dsn)
	if code != exitOK || strings.Contains(stdout, made) || strings.Contains(stdout, firstToken) {
		t.Fatalf("token list holds a token, or failed (exit %d):\n%s", code, stdout)
	}
	if line := lineWith(stdout, id); strings.HasSuffix(strings.TrimSpace(line), "-") {
		t.Fatalf("token list does not show %s revoked: %q", id, line)
	}
	if code, _, stderr = runCmd(t, noEnv, "token", "revoke", "utok_nope", "--db", dsn); code != exitFail || !strings.Contains(stderr, "no user token has the id") {
		t.Fatalf("revoke of an unknown id: exit %d %q", code, stderr)
	}
	for _, r := range []*replica{r1, r2} {
		for _, tok := range []string{made, firstToken} {
			if strings.Contains(r.logs.String(), tok) {
				t.Fatalf("serve's output holds a user token:\n%s", r.logs.String())
			}
		}
	}
}

func lineWith(text, s string) string {
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, s) {
			return line
		}
	}
	return ""
}

// On one machine (SQLite) the first start writes the token file and keeps
// its hash in the database; a restart uses the same file; a token file
// from before user tokens lived in the database is registered once; a
// revoked file token stays refused after a restart.
func TestUserTokenFileOnOneMachine(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "user-token")
	func() {
		r := startServe(t, "--data-dir", dir)
		defer r.stop()
		tok := readToken(t, file)
		if got := r.status(t, tok); got != http.StatusOK {
			t.Fatalf("the first start's token: %d", got)
		}
	}()
	tok := readToken(t, file)
	func() {
		r := startServe(t, "--data-dir", dir)
		defer r.stop()
		if got := r.status(t, tok); got != http.StatusOK || readToken(t, file) != tok {
			t.Fatalf("after a restart the file token answers %d (or the file changed)", got)
		}
	}()
	code, stdout, _ := runCmd(t, noEnv, "token", "list", "--data-dir", dir)
	if code != exitOK || strings.Count(stdout, "\n") != 2 {
		t.Fatalf("token list after two starts (want one token):\n%s", stdout)
	}
	id := strings.Fields(strings.Split(stdout, "\n")[1])[0]
	if code, _, stderr := runCmd(t, noEnv, "token", "revoke", id, "--data-dir", dir); code != exitOK {
		t.Fatalf("revoke: %d %s", code, stderr)
	}
	func() {
		r := startServe(t, "--data-dir", dir)
		defer r.stop()
		if got := r.status(t, tok); got != http.StatusUnauthorized {
			t.Fatalf("a revoked file token after a restart: %d", got)
		}
		if !strings.Contains(r.logs.String(), "was revoked") {
			t.Fatalf("serve does not say the file's token was revoked:\n%s", r.logs.String())
		}
	}()

	// An older data directory: a token file the database does not know.
	old := t.TempDir()
	legacy := "rdu_from-an-older-version-0123456789abcdef"
	if err := writeSecret(filepath.Join(old, "user-token"), legacy+"\n"); err != nil {
		t.Fatal(err)
	}
	r := startServe(t, "--data-dir", old)
	defer r.stop()
	if got := r.status(t, legacy); got != http.StatusOK {
		t.Fatalf("the token file of an older version: %d", got)
	}
}

func readToken(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}
