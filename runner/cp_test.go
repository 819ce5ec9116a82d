package runner

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore"
	"github.com/runnerd/runnerd/heartbeat"
	"github.com/runnerd/runnerd/internal/syncbuf"
	"github.com/runnerd/runnerd/wire"
)

// cp is the real reference control plane on a real SQLite store behind a
// loopback server, with one registered host. Its clock is real time plus
// an offset a test may move forward to expire leases.
type cp struct {
	t         *testing.T
	st        store.Store
	srv       *controlplane.Server
	url       string
	hostToken string
	wc        *wire.Client

	// noCancels makes the control plane answer the host's cancel poll 404,
	// as a release without it does.
	noCancels atomic.Bool

	mu     sync.Mutex
	offset time.Duration
}

func newCP(t *testing.T) *cp {
	t.Helper()
	// Releases are retried after 200 ms rather than 5 s, scaled down with
	// the tests' other timings (K7).
	c := &cp{t: t}
	st, err := sqlstore.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "cp.db"),
		sqlstore.WithReleaseBackoff(200*time.Millisecond), sqlstore.WithClock(func(time.Time) time.Time { return c.now() }))
	if err != nil {
		t.Fatalf("open sqlite store: %v", err)
	}
	c.st = st
	c.srv = controlplane.New(controlplane.Config{
		Store:        st,
		Logger:       slog.New(slog.DiscardHandler),
		Now:          c.now,
		MinLeaseTTL:  time.Second,
		ClaimWaitMax: time.Second,
	})
	h := c.srv.Handler()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == wire.PathCancels && c.noCancels.Load() {
			http.NotFound(w, r)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { hs.Close(); st.Close() })
	c.url = hs.URL
	c.wc = &wire.Client{BaseURL: hs.URL}
	c.hostToken = controlplane.NewToken(controlplane.HostTokenPrefix)
	if _, err := st.CreateHost(context.Background(), "host-a", controlplane.HashToken(c.hostToken), store.Audit{Actor: "test"}, c.now()); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *cp) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

func (c *cp) advance(d time.Duration) {
	c.mu.Lock()
	c.offset += d
	c.mu.Unlock()
}

// enqueue creates a conversation and one turn with prompt; it returns the job.
func (c *cp) enqueue(prompt string) wire.Job {
	c.t.Helper()
	ctx := context.Background()
	conv, err := c.st.CreateConversation(ctx, wire.CreateConversationRequest{Image: "scratch", AgentCommand: []string{"demoagent"}}, c.now())
	if err != nil {
		c.t.Fatal(err)
	}
	j, err := c.st.EnqueueTurn(ctx, conv.ID, prompt, c.now())
	if err != nil {
		c.t.Fatal(err)
	}
	return j
}

// claim claims the next turn with the host token, as a daemon would.
func (c *cp) claim(ttl time.Duration) wire.Claim {
	c.t.Helper()
	cl, err := c.wc.Claim(context.Background(), c.hostToken, wire.ClaimRequest{WaitMS: 0, LeaseTTLMS: ttl.Milliseconds()})
	if err != nil {
		c.t.Fatalf("claim: %v", err)
	}
	return cl
}

func (c *cp) job(id string) wire.Job {
	c.t.Helper()
	j, err := c.st.GetJob(context.Background(), id)
	if err != nil {
		c.t.Fatal(err)
	}
	return j
}

func (c *cp) conversation(id string) wire.Conversation {
	c.t.Helper()
	v, err := c.st.GetConversation(context.Background(), id)
	if err != nil {
		c.t.Fatal(err)
	}
	return v
}

// eventTypes lists the job's event types in order.
func (c *cp) eventTypes(id string) []string {
	var out []string
	for _, e := range c.job(id).Events {
		out = append(out, e.Type)
	}
	return out
}

// waitFor polls cond on real time: the control plane is a real server and
// the children are real processes, so there is no fake clock to advance.
func waitFor(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// testTimings are scaled-down renewal timings for real-time tests. They
// are generous for a shared, noisy two-core machine under -race.
var testTimings = heartbeat.Timings{
	LeaseTTL:       3 * time.Second,
	Interval:       300 * time.Millisecond,
	RequestTimeout: time.Second,
	RetryDelay:     100 * time.Millisecond,
}

// logBuf collects the daemon's JSON records.
type logBuf struct{ syncbuf.Buffer }

// count is how many records named msg were written.
func (l *logBuf) count(msg string) int {
	return strings.Count(l.String(), `"msg":"`+msg+`"`)
}

func (l *logBuf) has(msg string) bool { return l.count(msg) > 0 }

// noSecrets fails when a token reached a record.
func (l *logBuf) noSecrets(t *testing.T, secrets ...string) {
	t.Helper()
	s := l.String()
	for _, sec := range slices.DeleteFunc(secrets, func(s string) bool { return s == "" }) {
		if strings.Contains(s, sec) {
			t.Errorf("a record contains a secret %q…", sec[:6])
		}
	}
}
