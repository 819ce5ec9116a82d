package failover_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnerd/runnerd/internal/failover"
)

// replica is a loopback server that answers its name, or 503 while down.
type replica struct {
	*httptest.Server
	down  atomic.Bool
	mu    sync.Mutex // guards paths
	paths []string
}

func newReplica(t *testing.T, name string) *replica {
	r := &replica{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.paths = append(r.paths, req.URL.Path)
		r.mu.Unlock()
		if r.down.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, name)
	}))
	t.Cleanup(r.Close)
	return r
}

func call(t *testing.T, c *http.Client, base string) (string, error) {
	t.Helper()
	resp, err := c.Get(base + "/v1/agent/host/heartbeat")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", &statusErr{resp.StatusCode}
	}
	return string(b), nil
}

type statusErr struct{ code int }

func (e *statusErr) Error() string { return http.StatusText(e.code) }

// Calls go to the first address; a 5xx or a transport failure sends the
// next call (never the same one again) to the next address; the
// preferred one gets the calls back once its /readyz answers 200.
func TestFailoverAndBack(t *testing.T) {
	a, b := newReplica(t, "a"), newReplica(t, "b")
	e, err := failover.Parse(a.URL + "/cp, " + b.URL)
	if err != nil {
		t.Fatal(err)
	}
	e.SetProbeEvery(10 * time.Millisecond)
	var switches atomic.Int32
	e.OnSwitch(func(from, to string) { switches.Add(1) })
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: e.Transport(tr)}

	if got, err := call(t, c, e.Base()); got != "a" || err != nil {
		t.Fatalf("first call: %q %v", got, err)
	}
	a.mu.Lock()
	if a.paths[0] != "/cp/v1/agent/host/heartbeat" {
		t.Errorf("the preferred address got %s", a.paths[0])
	}
	a.mu.Unlock()

	a.down.Store(true)
	if _, err := call(t, c, e.Base()); err == nil {
		t.Fatal("a 503 was hidden: the call was sent again")
	}
	if got, err := call(t, c, e.Base()); got != "b" || err != nil {
		t.Fatalf("after a 503 the next call: %q %v, want b", got, err)
	}
	b.mu.Lock()
	if last := b.paths[len(b.paths)-1]; last != "/v1/agent/host/heartbeat" {
		t.Errorf("the second address got %s: the preferred one's path prefix was kept", last)
	}
	b.mu.Unlock()

	a.down.Store(false)
	deadline := time.Now().Add(30 * time.Second)
	for e.Current() != strings.TrimSuffix(a.URL+"/cp", "/") {
		if time.Now().After(deadline) {
			t.Fatalf("still on %s after the preferred address answers again", e.Current())
		}
		if _, err := call(t, c, e.Base()); err != nil {
			t.Fatalf("a call while b serves: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // paces the calls that let the probe run; no result depends on it
	}
	if got, _ := call(t, c, e.Base()); got != "a" {
		t.Fatalf("back on the preferred address, a call got %q", got)
	}

	// A transport failure moves the calls too.
	a.Close()
	if _, err := call(t, c, e.Base()); err == nil {
		t.Fatal("a refused connection was hidden")
	}
	if got, err := call(t, c, e.Base()); got != "b" || err != nil {
		t.Fatalf("after a refused connection: %q %v", got, err)
	}
	if switches.Load() != 3 {
		t.Errorf("%d switches recorded, want 3", switches.Load())
	}
	// A call its caller cancelled is no verdict on the address.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.Base()+"/x", nil)
	if _, err := c.Do(req); err == nil {
		t.Fatal("a cancelled call went through")
	}
	if e.Current() != b.URL {
		t.Errorf("a cancelled call moved the calls to %s", e.Current())
	}
}

func TestParseNamesTheBadEntry(t *testing.T) {
	for list, want := range map[string]string{
		"http://a:1,ftp://b":     `"ftp://b": want an http:// or https:// URL`,
		"http://a:1,,http://b:2": `"": want an http:// or https:// URL`,
		"http://a:1,http://a:1/": `"http://a:1/" is given twice`,
		"https://a:1,b:2":        `"b:2": want an http:// or https:// URL`,
	} {
		if _, err := failover.Parse(list); err == nil || err.Error() != want {
			t.Errorf("Parse(%q): %v, want %s", list, err, want)
		}
	}
	e, err := failover.Parse(" https://a:1/cp/ , http://b:2 ")
	if err != nil || e.Len() != 2 || e.Base() != "https://a:1/cp" {
		t.Fatalf("Parse: %v %v", e, err)
	}
}
