package chaos

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/runnerd/runnerd/internal/fleet"
)

// postgres is the campaign's own PostgreSQL cluster, in a directory of its
// own, serving on the bridge's address: never the machine's shared cluster
// (other tests use it), so that restarting it harms no one else.
type postgres struct {
	t        *testing.T
	bin      string // the postgres executable
	dir      string // the data directory
	sock     string // its unix socket directory
	listen   string
	port     int
	uid, gid uint32
	log      io.Writer

	cmd  *exec.Cmd
	done chan struct{}
}

// pgBinDir is the newest installed PostgreSQL's bin directory.
func pgBinDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	if len(dirs) == 0 {
		return "", fmt.Errorf("no PostgreSQL server under /usr/lib/postgresql")
	}
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(dirs[i]))))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(dirs[j]))))
		return vi < vj
	})
	return filepath.Dir(dirs[len(dirs)-1]), nil
}

// startPostgres initialises a cluster whose superuser is runnerd (trust
// on the bridge's /24), starts it on listen:port and creates the database
// chaos. t.Cleanup stops it and removes its directory.
func startPostgres(t *testing.T, listen, subnet string, port int, log io.Writer) *postgres {
	t.Helper()
	bin, err := pgBinDir()
	if err != nil {
		t.Fatal(err)
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Fatalf("the postgres user: %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	root, err := os.MkdirTemp("", "runnerd-chaos-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	p := &postgres{t: t, bin: filepath.Join(bin, "postgres"), dir: filepath.Join(root, "data"), sock: filepath.Join(root, "sock"),
		listen: listen, port: port, uid: uint32(uid), gid: uint32(gid), log: log}
	for _, d := range []string{p.dir, p.sock} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", p.dir, "-U", "runnerd", "--auth=trust", "-E", "UTF8", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: p.uid, Gid: p.gid}}
	initdb.Dir = root
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	hba, err := os.OpenFile(filepath.Join(p.dir, "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(hba, "host all all %s trust\n", subnet)
	hba.Close()
	if err := p.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.stop(syscall.SIGINT) })
	psql := exec.Command(filepath.Join(bin, "psql"), "-h", p.listen, "-p", strconv.Itoa(p.port), "-U", "runnerd", "-d", "postgres", "-q", "-c", "CREATE DATABASE chaos")
	if out, err := psql.CombinedOutput(); err != nil {
		t.Fatalf("create the database: %v\n%s", err, out)
	}
	return p
}

// dsn is the campaign database's address for the replicas.
func (p *postgres) dsn() string {
	return fmt.Sprintf("postgres://runnerd@%s:%d/chaos?sslmode=disable&connect_timeout=2", p.listen, p.port)
}

// start starts the server and waits until it accepts connections.
func (p *postgres) start() error {
	cmd := exec.Command(p.bin, "-D", p.dir, "-p", strconv.Itoa(p.port), "-k", p.sock,
		"-c", "listen_addresses="+p.listen,
		// No OS crash happens here, so fsync buys nothing; every commit
		// stays synchronous, so a restart (even an immediate one) keeps
		// every acknowledged write, as the product relies on.
		"-c", "fsync=off", "-c", "max_connections=300", "-c", "log_min_messages=warning")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: p.uid, Gid: p.gid}, Setpgid: true}
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	p.cmd, p.done = cmd, done
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return fleet.Poll(ctx, 100*time.Millisecond, "postgres to accept connections", func(ctx context.Context) (bool, error) {
		select {
		case <-done:
			return false, fmt.Errorf("postgres exited: %v", cmd.ProcessState)
		default:
		}
		isready := exec.CommandContext(ctx, filepath.Join(filepath.Dir(p.bin), "pg_isready"), "-q", "-h", p.listen, "-p", strconv.Itoa(p.port))
		return isready.Run() == nil, nil
	})
}

// pid is the postmaster's pid.
func (p *postgres) pid() int { return p.cmd.Process.Pid }

// stop shuts the server down with sig (SIGINT: fast, SIGQUIT: immediate,
// a crash as far as its data is concerned) and waits for it.
func (p *postgres) stop(sig syscall.Signal) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}
