package controlplane_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"html"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/wire"
)

// The admin pages in a real browser: Debian's chromium, headless, driven
// over the DevTools protocol (chromedp). One browser serves the whole test
// binary; each test opens its own tab. Without chromium these tests skip,
// unless RUNNERD_REQUIRE_BROWSER=1 (.ci/run sets it) makes that a failure.

// browser is the test binary's one chromium, started by the first browser
// test and ended by TestMain (closeBrowser).
var browser struct {
	once   sync.Once
	ctx    context.Context // the browser's own; tabs are opened in it
	cancel context.CancelFunc
	err    error
}

// browserTimeout bounds each step a test asks of the browser.
const browserTimeout = 30 * time.Second

func chromiumPath() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// closeBrowser ends the browser if a test started it.
func closeBrowser() {
	if browser.cancel != nil {
		browser.cancel()
	}
}

// newTab opens a tab of the shared browser that sends the user token as
// Basic credentials with every request, as a browser that cached them
// after the admin page's challenge does (to every site's requests: which
// is what the CSRF defence is for).
func newTab(t *testing.T) context.Context {
	t.Helper()
	path := chromiumPath()
	if path == "" {
		if os.Getenv("RUNNERD_REQUIRE_BROWSER") == "1" {
			t.Fatal("chromium is not on PATH and RUNNERD_REQUIRE_BROWSER=1: install it (apt-get install chromium)")
		}
		t.Skip("chromium is not on PATH: the admin pages' browser tests are skipped (apt-get install chromium; RUNNERD_REQUIRE_BROWSER=1 makes this a failure)")
	}
	browser.once.Do(func() {
		opts := append(chromedp.DefaultExecAllocatorOptions[:],
			chromedp.ExecPath(path),
			chromedp.WindowSize(1280, 900),
			chromedp.Flag("disable-dev-shm-usage", true),
		)
		if os.Geteuid() == 0 {
			opts = append(opts, chromedp.NoSandbox) // chromium refuses to run as root with its sandbox
		}
		actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
		bctx, bcancel := chromedp.NewContext(actx)
		browser.ctx = bctx
		browser.cancel = func() { bcancel(); acancel() }
		browser.err = chromedp.Do(bctx) // starts chromium
	})
	if browser.err != nil {
		t.Fatalf("start chromium (%s): %v", path, browser.err)
	}
	tab, cancel := chromedp.NewContext(browser.ctx)
	t.Cleanup(cancel)
	basic := base64.StdEncoding.EncodeToString([]byte("admin:" + userToken))
	// The tab's first action opens it, on the tab's own context: a
	// deadline on that one would close the tab when it passed.
	if err := chromedp.Do(tab, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		if _, err := cdp.Call(ctx, tg, network.Enable, network.EnableParams{}); err != nil {
			return err
		}
		_, err := cdp.Call(ctx, tg, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{
			Headers: network.Headers{"Authorization": "Basic " + basic}})
		return err
	})); err != nil {
		t.Fatalf("open a tab: %v", err)
	}
	return tab
}

// run runs browser steps, bounded by browserTimeout.
func run(t *testing.T, tab context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, browserTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("browser, %s: %v", what, err)
	}
}

// get runs one browser action that reads a value, bounded by browserTimeout.
func get[T any](t *testing.T, tab context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, browserTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("browser, %s: %v", what, err)
	}
	return v
}

// visit opens url and returns the text of selector as the page renders it.
func visit(t *testing.T, tab context.Context, url, selector string) string {
	t.Helper()
	run(t, tab, "open "+url, chromedp.Navigate(url))
	return textOf(t, tab, selector)
}

// textOf is the rendered text of the first node selector matches.
func textOf(t *testing.T, tab context.Context, selector string) string {
	t.Helper()
	return get(t, tab, "read "+selector, chromedp.Text(chromedp.CSS(selector), chromedp.NodeVisible))
}

// screenshot saves the whole page as a PNG in the test's temporary
// directory (RUNNERD_SCREENSHOT_DIR keeps them elsewhere, to look at).
func screenshot(t *testing.T, tab context.Context, name string) {
	t.Helper()
	png := get(t, tab, "screenshot "+name, chromedp.FullScreenshot(100))
	dir := os.Getenv("RUNNERD_SCREENSHOT_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	p := filepath.Join(dir, name+".png")
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s (%d bytes)", p, len(png))
}

func contains(t *testing.T, what, text string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(text, w) {
			t.Fatalf("%s does not read %q; it reads:\n%s", what, w, text)
		}
	}
}

// What a person sees on each admin page: a host's launch error beside
// the host, an offline host offline, a host paused and resumed from its
// row; a job's attempts in generation order with their lease owners,
// expiries, events and the stale report of the superseded one, which names
// the next attempt only because that attempt's events exist (R19, R20); a
// LOST conversation in plain words (R32).
func TestBrowserAdminPages(t *testing.T) {
	tab := newTab(t)
	f := newFixture(t)
	ctx := context.Background()
	hostB := f.addHost("host-b")
	hostC := f.addHost("host-c")
	if _, err := f.wc.HostHeartbeat(ctx, hostC, wire.HostHeartbeat{Capacity: 1, Draining: true, IntervalMS: 10_000}); err != nil {
		t.Fatal(err)
	}

	// One job superseded on host-a, claimed again by host-b; host-a's
	// late renewal is refused and recorded as a stale report.
	conv := f.newConversation()
	f.send(conv.ID, "hello")
	a := f.claim()
	f.clock.Advance(controlplane.DefaultLeaseTTL + controlplane.DefaultReaperGrace + time.Second)
	f.srv.Sweep(ctx)
	b, err := f.wc.Claim(ctx, hostB, wire.ClaimRequest{})
	if err != nil || b.JobID != a.JobID {
		t.Fatalf("host-b's claim: %+v, %v", b, err)
	}
	if _, err := f.wc.Renew(ctx, a.WorkerToken, a.JobID, wire.RenewRequest{AttemptRef: ref(a)}); err == nil {
		t.Fatal("host-a's renewal after the supersession was accepted")
	}

	// A conversation lost because its retained session is gone (R31),
	// and one quarantined because its admitted turn failed unsettled (K13).
	lost := f.newConversation()
	f.send(lost.ID, "hi")
	l := f.claim()
	if _, err := f.wc.Admission(ctx, l.WorkerToken, l.JobID, wire.AdmissionRequest{AttemptRef: ref(l), ActivationID: "act-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.wc.Finish(ctx, l.WorkerToken, l.JobID, wire.FinishRequest{AttemptRef: ref(l), Outcome: wire.OutcomeFailed,
		Class: "workspace_missing", Unrecoverable: true}); err != nil {
		t.Fatal(err)
	}
	quarantined := f.newConversation()
	f.send(quarantined.ID, "hi")
	q := f.claim()
	if _, err := f.wc.Admission(ctx, q.WorkerToken, q.JobID, wire.AdmissionRequest{AttemptRef: ref(q), ActivationID: "act-2"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.wc.Finish(ctx, q.WorkerToken, q.JobID, wire.FinishRequest{AttemptRef: ref(q), Outcome: wire.OutcomeFailed, Class: "settlement_failed"}); err != nil {
		t.Fatal(err)
	}

	// host-a's launches fail; host-b is healthy.
	since := f.clock.Now().Add(-2 * time.Minute)
	if _, err := f.wc.HostHeartbeat(ctx, f.hostToken, wire.HostHeartbeat{Capacity: 2,
		LaunchError: &wire.LaunchError{Class: "spawn_failed", Consecutive: 4, Since: since}}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.wc.HostHeartbeat(ctx, hostB, wire.HostHeartbeat{Capacity: 4, Running: 1, Version: "v1.2",
		Labels: wire.Labels{"sandbox": "docker", "gpu": "a100"}}); err != nil {
		t.Fatal(err)
	}

	// Servers: the launch error in host-a's own row, none in host-b's;
	// host-c, silent for 151 s after saying it drained, offline.
	rowA := visit(t, tab, f.url+"/admin/servers", `tr[data-host="host-a"]`)
	contains(t, "host-a's row", rowA, "host-a", "online", "spawn_failed: 4 consecutive launch failure(s) since", "claims paused", "0 / 2")
	rowB := textOf(t, tab, `tr[data-host="host-b"]`)
	contains(t, "host-b's row", rowB, "host-b", "online", "none", "1 / 4", "v1.2")
	contains(t, "host-b's labels", textOf(t, tab, `tr[data-host="host-b"] td.labels`), "gpu=a100", "sandbox=docker")
	if strings.Contains(rowB, "spawn_failed") {
		t.Fatalf("host-b's row shows host-a's launch error: %s", rowB)
	}
	rowC := textOf(t, tab, `tr[data-host="host-c"] td.host-state`)
	contains(t, "host-c's state", rowC, "offline: no heartbeat for 30s or more", "last said draining")
	noOverflow(t, tab, "servers", 1280)
	screenshot(t, tab, "servers")

	// Pause host-b from its row, then resume it.
	if resp := click(t, tab, `tr[data-host="host-b"] button.host-action`); resp.Status != http.StatusOK {
		t.Fatalf("host-b's Pause button: %d %s", resp.Status, resp.URL)
	}
	contains(t, "host-b's state after Pause", textOf(t, tab, `tr[data-host="host-b"] td.host-state`), "paused", "paused since")
	if h, err := f.st.HostByTokenHash(ctx, controlplane.HashToken(hostB)); err != nil || !h.Paused {
		t.Fatalf("host-b after its Pause button: %+v, %v", h, err)
	}
	noOverflow(t, tab, "servers-paused", 1280)
	screenshot(t, tab, "servers-paused")
	click(t, tab, `tr[data-host="host-b"] button.host-action`)
	contains(t, "host-b's state after Resume", textOf(t, tab, `tr[data-host="host-b"] td.host-state`), "online")
	if h, err := f.st.HostByTokenHash(ctx, controlplane.HashToken(hostB)); err != nil || h.Paused {
		t.Fatalf("host-b after its Resume button: %+v, %v", h, err)
	}

	// Jobs, filtered by host-b: the job, linked to its page.
	row := visit(t, tab, f.url+"/admin/jobs?host=host-b", `tr[data-job="`+a.JobID+`"]`)
	contains(t, "the job's row", row, a.JobID, "running", "host-b")
	run(t, tab, "follow the job's link", chromedp.Click(chromedp.CSS(`tr[data-job="`+a.JobID+`"] a`)), chromedp.WaitVisible(chromedp.CSS(`#attempts`)))

	// The job's timeline: generation 1 on host-a, then 2 on host-b.
	gens := get(t, tab, "read the attempts", chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("#attempts > li")).map(li => li.dataset.generation + " " + li.querySelector("h3").innerText)`))
	if len(gens) != 2 || !strings.HasPrefix(gens[0], "1 Generation 1 on host-a: superseded") || !strings.HasPrefix(gens[1], "2 Generation 2 on host-b: running") {
		t.Fatalf("the job's attempts read %q; want generation 1 on host-a (superseded), then 2 on host-b (running)", gens)
	}
	first := textOf(t, tab, `#attempts > li[data-generation="1"]`)
	contains(t, "the superseded attempt", first, a.AttemptID, "lease_owner", "lease_expires_at", "claimed", "attempt_superseded",
		"lease.stale_report", "1 write(s) from this attempt arrived after its lease was lost", "does not show", "generation 2 on host-b")
	second := textOf(t, tab, `#attempts > li[data-generation="2"]`)
	contains(t, "the running attempt", second, b.AttemptID, "claimed", "(in ")
	timeline := textOf(t, tab, `#timeline`)
	if i, j := strings.Index(timeline, "attempt_superseded"), strings.LastIndex(timeline, "lease.stale_report"); i < 0 || j < i {
		t.Fatalf("the event timeline does not put the stale report after the supersession:\n%s", timeline)
	}
	noOverflow(t, tab, "job", 1280)
	screenshot(t, tab, "job")

	// Conversations: LOST in the owner's plain words.
	lostRow := visit(t, tab, f.url+"/admin/conversations", `tr[data-conversation="`+lost.ID+`"]`)
	contains(t, "the lost conversation's row", lostRow, "Lost: This conversation is no longer available: its saved working state could not be found, so it cannot be continued.")
	for _, jargon := range []string{"lease", "attempt", "admitted", "R30"} {
		if strings.Contains(strings.ToLower(lostRow[:strings.Index(lostRow, "continued.")]), jargon) {
			t.Fatalf("the lost conversation's words say %q: %s", jargon, lostRow)
		}
	}
	contains(t, "the usable conversation's row", textOf(t, tab, `tr[data-conversation="`+conv.ID+`"]`), "Usable", "Mark lost")
	contains(t, "the quarantined conversation's row", textOf(t, tab, `tr[data-conversation="`+quarantined.ID+`"]`),
		"Quarantined: the reply of "+q.JobID+" was interrupted", "Mark lost")
	noOverflow(t, tab, "conversations", 1280)
	screenshot(t, tab, "conversations")

	// A turn no online host can take says so on its job, with the label
	// the closest host (host-b) lacks (routing, issue 13 §1).
	var zoned wire.Conversation
	f.user(http.MethodPost, "/v1/conversations", wire.CreateConversationRequest{Image: "demo:latest", AgentCommand: []string{"demo-agent"},
		Sandbox: wire.SandboxDocker, Requires: wire.Labels{"gpu": "a100", "zone": "eu-1"}}, &zoned)
	stuck := f.send(zoned.ID, "anyone?")
	f.srv.Sweep(ctx)
	contains(t, "the unroutable job", visit(t, tab, f.url+"/admin/jobs/"+stuck.ID, `#job`), "queued", "no live host can take this turn: missing zone=eu-1")
	contains(t, "the unroutable job's row", visit(t, tab, f.url+"/admin/jobs?state=queued", `tr[data-job="`+stuck.ID+`"]`), "unroutable: needs zone=eu-1")
	noOverflow(t, tab, "job-unroutable", 1280)
	screenshot(t, tab, "job-unroutable")
}

// In a real browser holding the admin credentials, another site's form
// that posts to the control plane is refused and changes nothing; the job
// page's own Cancel button works.
func TestBrowserCrossSiteFormRefused(t *testing.T) {
	tab := newTab(t)
	f := newFixture(t)
	c := f.newConversation()
	j := f.send(c.ID, "hello")

	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!doctype html><title>Win a prize</title>
<form method="post" action="%[1]s/admin/jobs/%[2]s/cancel"><input type="hidden" name="csrf" value="guessed"><button id="form">Claim prize</button></form>
<form method="post" action="%[1]s/v1/jobs/%[2]s/cancel"><button id="api">Claim another</button></form>
<form method="post" action="%[1]s/v1/admin/conversations/%[3]s/lose"><button id="lose">And another</button></form>`,
			html.EscapeString(f.url), j.ID, c.ID)
	}))
	t.Cleanup(evil.Close)
	// localhost and 127.0.0.1 are different sites to the browser.
	evilURL := strings.Replace(evil.URL, "127.0.0.1", "localhost", 1)

	for _, button := range []struct {
		sel    string
		status int64
	}{{"#form", http.StatusForbidden}, {"#api", http.StatusForbidden}, {"#lose", http.StatusForbidden}} {
		run(t, tab, "open another site's page", chromedp.Navigate(evilURL))
		resp := click(t, tab, button.sel)
		body := textOf(t, tab, "body")
		if resp.Status != button.status || !strings.Contains(body, "another site") {
			t.Fatalf("another site's %s: the control plane answered %d %q, want %d and a refusal", button.sel, resp.Status, body, button.status)
		}
		if got := f.job(j.ID); got.State != wire.JobQueued || got.CancelRequested {
			t.Fatalf("another site's %s cancelled the job: %+v", button.sel, got)
		}
		if got, _ := f.st.GetConversation(context.Background(), c.ID); got.State != wire.ConversationUsable {
			t.Fatalf("another site's %s lost the conversation", button.sel)
		}
	}

	// The job page's own button.
	visit(t, tab, f.url+"/admin/jobs/"+j.ID, `#cancel`)
	if resp := click(t, tab, "#cancel"); resp.Status != http.StatusOK || !strings.HasSuffix(resp.URL, "/admin/jobs/"+j.ID) {
		t.Fatalf("the page's Cancel button led to %d %s, want the job page again", resp.Status, resp.URL)
	}
	contains(t, "the job after its Cancel button", textOf(t, tab, `#job`), "cancelled", "Cancelled.")
	if got := f.job(j.ID); got.State != wire.JobCancelled {
		t.Fatalf("the page's own Cancel button left the job %s", got.State)
	}
}

// click clicks selector and waits for the page it leads to, returning
// that page's response.
func click(t *testing.T, tab context.Context, selector string) *network.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, browserTimeout)
	defer cancel()
	resp, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(selector), chromedp.NodeVisible))
	if err != nil {
		t.Fatalf("browser, click %s: %v", selector, err)
	}
	return resp
}

// titled creates a conversation with a title.
func (f *fixture) titled(title string) wire.Conversation {
	f.t.Helper()
	var c wire.Conversation
	f.user(http.MethodPost, "/v1/conversations", wire.CreateConversationRequest{
		Title: title, Image: "demo:latest", AgentCommand: []string{"demo-agent"},
	}, &c)
	return c
}

// atAGlance is the fleet the at-a-glance browser test reads, as of
// f.clock.Now(), t0+105 s: host-a online but its launches fail, host-b
// online and healthy with one turn, host-c drained and stopped, host-d
// silent for 105 s with a turn still leased to it (dead), host-e under
// sandbox pressure.
type atAGlance struct {
	login, notes, pending, cancelled, spare      wire.Conversation
	loginJob, notesJob, pendingJob, cancelledJob wire.Job
}

func newAtAGlance(t *testing.T, f *fixture) atAGlance {
	t.Helper()
	ctx := context.Background()
	hostB, hostC, hostD, hostE := f.addHost("host-b"), f.addHost("host-c"), f.addHost("host-d"), f.addHost("host-e")
	instance := func(id string, stopping bool) *wire.Client {
		h := http.Header{}
		h.Set(wire.HeaderInstanceID, id)
		h.Set(wire.HeaderBootID, "boot-"+id)
		if stopping {
			h.Set(wire.HeaderInstanceStopping, "1")
		}
		return &wire.Client{BaseURL: f.url, Header: h}
	}
	beat := func(c *wire.Client, tok string, hb wire.HostHeartbeat) {
		t.Helper()
		if _, err := c.HostHeartbeat(ctx, tok, hb); err != nil {
			t.Fatal(err)
		}
	}
	// t0: host-c drains and stops; host-d heartbeats, then is heard no more.
	beat(instance("inst-c", false), hostC, wire.HostHeartbeat{Capacity: 2, Draining: true})
	beat(instance("inst-c", true), hostC, wire.HostHeartbeat{Capacity: 2, Draining: true})
	beat(f.wc, hostD, wire.HostHeartbeat{Capacity: 2})

	var g atAGlance
	g.login = f.titled("Fix the login bug")
	g.notes = f.titled("Write the release notes for " + strings.Repeat("runnerd-v2.0.0-rc1-", 8)) // long, unbroken
	g.pending = f.titled("")
	g.cancelled = f.titled("Cancelled by its owner")
	g.spare = f.titled("Old experiment on host-d")
	g.loginJob = f.send(g.login.ID, "the login fails\nwith a 500")
	g.notesJob = f.send(g.notes.ID, "write them")
	g.cancelledJob = f.send(g.cancelled.ID, "never mind")
	g.pendingJob = f.send(g.pending.ID, "later")

	f.clock.Advance(5 * time.Second)
	if c, err := f.wc.Claim(ctx, hostD, wire.ClaimRequest{}); err != nil || c.JobID != g.loginJob.ID {
		t.Fatalf("host-d's claim: %+v, %v", c, err)
	}
	f.clock.Advance(10 * time.Second)
	if c, err := f.wc.Claim(ctx, hostB, wire.ClaimRequest{}); err != nil || c.JobID != g.notesJob.ID {
		t.Fatalf("host-b's claim: %+v, %v", c, err)
	}
	f.clock.Advance(5 * time.Second)
	f.expect("POST", "/v1/jobs/"+g.cancelledJob.ID+"/cancel", userToken, "", http.StatusOK, "")

	f.clock.Advance(85 * time.Second) // t0+105 s
	beat(f.wc, f.hostToken, wire.HostHeartbeat{Capacity: 2,
		LaunchError: &wire.LaunchError{Class: "spawn_failed", Consecutive: 3, Since: f.clock.Now().Add(-time.Minute)}})
	beat(f.wc, hostB, wire.HostHeartbeat{Capacity: 4, Running: 1})
	beat(f.wc, hostE, wire.HostHeartbeat{Capacity: 3, SandboxPressure: &wire.SandboxPressure{Resource: wire.PressureDisk,
		FreeBytes: 1 << 30, TotalBytes: 100 << 30, MinFreeBytes: 5 << 30, Since: f.clock.Now().Add(-time.Minute)}})
	return g
}

// noOverflow fails unless the page fits its window's width.
func noOverflow(t *testing.T, tab context.Context, what string, width int64) {
	t.Helper()
	got := get(t, tab, "measure "+what, chromedp.Evaluate[[]int64](`[document.documentElement.scrollWidth, window.innerWidth]`))
	if len(got) != 2 || got[1] != width || got[0] > got[1] {
		t.Fatalf("%s at %d px: scrollWidth %d in a window %d wide: it overflows", what, width, got[0], got[1])
	}
}

// TestBrowserAdminAtAGlance: what an operator reads at a glance, in a
// real browser at 1280 and 1920 px, every page fitting the width, each
// saved as a full-page screenshot: Servers' fleet totals, each host's
// current turns linked to their job pages, a drained host coloured apart
// from a dead one and a launch-paused or pressured host not green; the
// jobs list's conversation titles, queue waits and run times, and the
// job page's; Mark lost asking for the conversation's id on a page that
// names it, refused without it; a bad filter answered as a page.
func TestBrowserAdminAtAGlance(t *testing.T) {
	tab := newTab(t)
	f := newFixture(t)
	g := newAtAGlance(t, f)

	for _, width := range []int64{1280, 1920} {
		shot := func(name string) {
			t.Helper()
			noOverflow(t, tab, name, width)
			screenshot(t, tab, fmt.Sprintf("glance-%s-%d", name, width))
		}
		run(t, tab, "set the window", chromedp.EmulateViewport(width, 900))

		// Servers: the totals.
		run(t, tab, "open Servers", chromedp.Navigate(f.url+"/admin/servers"))
		totals := get(t, tab, "read the totals", chromedp.Evaluate[map[string]string](`Object.fromEntries(
			[...document.querySelectorAll("#totals dd")].map(d => [d.id || d.dataset.look, d.innerText.trim()]))`))
		want := map[string]string{"total-hosts": "5", "online": "1", "launch-paused": "1", "sandbox-pressure": "1",
			"claims-withheld": "0", "paused": "0", "draining": "0", "drained": "1", "offline": "1",
			"total-running": "2", "total-queued": "1", "total-capacity": "1 / 9", "total-free": "3"}
		for k, v := range want {
			if totals[k] != v {
				t.Fatalf("at %d px the totals read %v; want %s = %s (all: %v)", width, totals, k, v, want)
			}
		}
		// Each host's look: its class and its colours.
		type look struct{ Class, Color, Background, Text string }
		looks := get(t, tab, "read the looks", chromedp.Evaluate[map[string]look](`Object.fromEntries(
			[...document.querySelectorAll("#servers tr[data-host]")].map(tr => { const s = tr.querySelector("td.host-state .look"), c = getComputedStyle(s);
			return [tr.dataset.host, {Class: s.className, Color: c.color, Background: c.backgroundColor, Text: s.innerText}]; }))`))
		for host, class := range map[string]string{"host-a": "host-launch-paused", "host-b": "host-online", "host-c": "host-drained",
			"host-d": "host-offline", "host-e": "host-sandbox-pressure"} {
			if !strings.Contains(looks[host].Class, class) {
				t.Fatalf("%s's state reads %+v; want class %s", host, looks[host], class)
			}
		}
		green := looks["host-b"]
		for _, h := range []string{"host-a", "host-c", "host-d", "host-e"} {
			if l := looks[h]; l.Color == green.Color || l.Background == green.Background {
				t.Fatalf("%s is coloured as the healthy online host-b (%+v): %+v", h, green, l)
			}
		}
		if c, d := looks["host-c"], looks["host-d"]; c.Background == d.Background || c.Color == d.Color {
			t.Fatalf("the drained host-c (%+v) is coloured as the dead host-d (%+v)", c, d)
		}
		contains(t, "host-c's state", textOf(t, tab, `tr[data-host="host-c"] td.host-state`), "drained", "stopped after draining")
		contains(t, "host-d's state", textOf(t, tab, `tr[data-host="host-d"] td.host-state`), "offline: no heartbeat for 30s or more",
			"1 turn(s) leased to it wait for the reaper")
		contains(t, "host-a's state", textOf(t, tab, `tr[data-host="host-a"] td.host-state`), "launch-paused")
		// Current turns, linked.
		turns := get(t, tab, "read the current turns", chromedp.Evaluate[map[string][]string](`Object.fromEntries(
			[...document.querySelectorAll("#servers tr[data-host]")].map(tr => [tr.dataset.host,
			[...tr.querySelectorAll("td.turns a")].map(a => new URL(a.href).pathname + " " + a.parentElement.innerText)]))`))
		for host, want := range map[string]string{"host-b": "/admin/jobs/" + g.notesJob.ID + " " + g.notesJob.ID + " turn 1, 1m30s",
			"host-d": "/admin/jobs/" + g.loginJob.ID + " " + g.loginJob.ID + " turn 1, 1m40s"} {
			if got := turns[host]; len(got) != 1 || got[0] != want {
				t.Fatalf("%s's current turns read %q; want [%q]", host, got, want)
			}
		}
		for _, host := range []string{"host-a", "host-c", "host-e"} {
			if len(turns[host]) != 0 {
				t.Fatalf("%s lists turns it does not hold: %q", host, turns[host])
			}
		}
		shot("servers")
		run(t, tab, "follow host-d's turn", chromedp.Click(chromedp.CSS(`tr[data-host="host-d"] td.turns a`)), chromedp.WaitVisible(chromedp.CSS(`#attempts`)))
		if loc := get(t, tab, "read the location", chromedp.Location()); !strings.HasSuffix(loc, "/admin/jobs/"+g.loginJob.ID) {
			t.Fatalf("host-d's turn led to %s", loc)
		}
		// The job page: its conversation's title, wait and run.
		contains(t, "the job page", textOf(t, tab, `#job`), "Fix the login bug", g.login.ID)
		contains(t, "the job's wait", textOf(t, tab, `#job td.wait`), "5s")
		contains(t, "the job's run", textOf(t, tab, `#job td.run`), "1m40s so far")
		shot("job")

		// Jobs: titles, waits and runs.
		run(t, tab, "open Jobs", chromedp.Navigate(f.url+"/admin/jobs"))
		rows := get(t, tab, "read the jobs", chromedp.Evaluate[map[string][]string](`Object.fromEntries(
			[...document.querySelectorAll("#jobs tr[data-job]")].map(tr => [tr.dataset.job,
			["td.conv .conv-title", "td.wait", "td.run"].map(s => tr.querySelector(s).innerText.trim())]))`))
		for id, want := range map[string][]string{
			g.loginJob.ID:     {"Fix the login bug", "5s", "1m40s so far"},
			g.notesJob.ID:     {g.notes.Title, "15s", "1m30s so far"},
			g.cancelledJob.ID: {"Cancelled by its owner", "20s", "not run"},
			g.pendingJob.ID:   {"untitled", "1m45s so far", "not run"},
		} {
			if got := rows[id]; strings.Join(got, "|") != strings.Join(want, "|") {
				t.Fatalf("at %d px the jobs list's row of %s reads %q; want %q", width, id, got, want)
			}
		}
		shot("jobs")

		// A bad filter: a page, not JSON.
		resp := get(t, tab, "open a bad filter", chromedp.NavigateResponse(f.url+"/admin/jobs?state=bogus"))
		if resp.Status != http.StatusBadRequest || !strings.HasPrefix(resp.MimeType, "text/html") {
			t.Fatalf("a bad filter: %d %s, want 400 text/html", resp.Status, resp.MimeType)
		}
		contains(t, "the bad filter's page", textOf(t, tab, `#refusal`), "state must be one of queued, running")
		if back := get(t, tab, "read the way back", chromedp.Evaluate[string](`new URL(document.querySelector("a#back").href).pathname`)); back != "/admin/jobs" {
			t.Fatalf("the bad filter's page leads back to %q", back)
		}
		shot("bad-filter")

		// Conversations; Mark lost's confirmation names the conversation.
		run(t, tab, "open Conversations", chromedp.Navigate(f.url+"/admin/conversations"))
		contains(t, "the login conversation's row", textOf(t, tab, `tr[data-conversation="`+g.login.ID+`"]`), "Fix the login bug", "Usable")
		shot("conversations")
		if width == 1920 {
			continue // the spare conversation was marked lost at 1280
		}
		run(t, tab, "follow Mark lost", chromedp.Click(chromedp.CSS(`tr[data-conversation="`+g.spare.ID+`"] a.mark-lost`)),
			chromedp.WaitVisible(chromedp.CSS(`#lose`)))
		contains(t, "the confirmation", textOf(t, tab, `h1`), "Old experiment on host-d", "lost?")
		contains(t, "the confirmation's conversation", textOf(t, tab, `#conversation-id`), g.spare.ID)
		contains(t, "the confirmation's button", textOf(t, tab, `#confirm-lose`), g.spare.ID)
		if get(t, tab, "look for a reload", chromedp.Evaluate[bool](`document.querySelector('meta[http-equiv="refresh"]') !== null`)) {
			t.Fatal("the Mark lost confirmation reloads itself, clearing what is typed")
		}
		shot("mark-lost")
		giveReason := chromedp.SendKeys(chromedp.CSS(`input[name="reason"]`), "host-d was decommissioned")
		for _, typed := range []string{"", g.login.ID} {
			run(t, tab, "give the reason", giveReason) // required: the browser sends no form without it
			if typed != "" {                           // the page's field starts empty
				run(t, tab, "type "+typed, chromedp.SendKeys(chromedp.CSS(`input[name="confirm"]`), typed))
			}
			if resp := click(t, tab, `#confirm-lose`); resp.Status != http.StatusBadRequest {
				t.Fatalf("Mark lost with %q typed: %d, want 400", typed, resp.Status)
			}
			contains(t, "the refusal", textOf(t, tab, `#refusal`), "type its id exactly", "nothing was changed")
			if c, _ := f.st.GetConversation(context.Background(), g.spare.ID); c.State != wire.ConversationUsable {
				t.Fatalf("Mark lost with %q typed marked it %s", typed, c.State)
			}
			if typed == "" {
				shot("mark-lost-refused")
			}
			run(t, tab, "go back", chromedp.Click(chromedp.CSS(`a#back`)), chromedp.WaitVisible(chromedp.CSS(`#lose`)))
		}
		run(t, tab, "type the id", giveReason, chromedp.SendKeys(chromedp.CSS(`input[name="confirm"]`), g.spare.ID))
		if resp := click(t, tab, `#confirm-lose`); resp.Status != http.StatusOK || !strings.HasSuffix(resp.URL, "/admin/conversations") {
			t.Fatalf("Mark lost with its id typed: %d %s, want Conversations again", resp.Status, resp.URL)
		}
		contains(t, "the spare conversation's row", textOf(t, tab, `tr[data-conversation="`+g.spare.ID+`"]`), "Lost")
		if c, _ := f.st.GetConversation(context.Background(), g.spare.ID); c.State != wire.ConversationLost {
			t.Fatalf("Mark lost with its id typed left it %s", c.State)
		}
	}
}
