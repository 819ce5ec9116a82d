package controlplane_test

import (
	"context"
	"html"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// adminRequest is a browser's request to the admin pages: Basic
// credentials (what a browser caches), extra headers, a form body.
type adminRequest struct {
	method, path string
	form         url.Values
	header       map[string]string
	bearer       bool // the token in a Bearer header instead of Basic
	token        string
}

func (f *fixture) admin(ar adminRequest) (int, string, http.Header) {
	f.t.Helper()
	var body io.Reader
	if ar.form != nil {
		body = strings.NewReader(ar.form.Encode())
	}
	req, err := http.NewRequest(ar.method, f.url+ar.path, body)
	if err != nil {
		f.t.Fatal(err)
	}
	if ar.form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	tok := ar.token
	if tok == "" {
		tok = userToken
	}
	if ar.bearer {
		req.Header.Set("Authorization", "Bearer "+tok)
	} else {
		req.SetBasicAuth("admin", tok)
	}
	for k, v := range ar.header {
		req.Header.Set(k, v)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		f.t.Fatalf("%s %s: %v", ar.method, ar.path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		f.t.Fatal(err)
	}
	return resp.StatusCode, string(b), resp.Header
}

var csrfInput = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrfOf reads the CSRF token a page's forms carry.
func csrfOf(t *testing.T, page string) string {
	t.Helper()
	m := csrfInput.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("the page has no form with a CSRF token:\n%s", page)
	}
	return m[1]
}

// A browser that cached the admin page's Basic credentials sends them to
// any site's request. So a change is refused from another origin (by
// Sec-Fetch-Site or Origin, net/http.CrossOriginProtection), an admin form
// is refused without the page's CSRF token (or with another token's), and
// the /v1 API refuses changes with Basic credentials at all; only the
// page's own form, same-origin, with its token, cancels the job.
func TestAdminFormsRefuseCrossSitePosts(t *testing.T) {
	f := newFixture(t)
	c := f.newConversation()
	j := f.send(c.ID, "hello")
	jobPath := "/admin/jobs/" + j.ID
	status, page, _ := f.admin(adminRequest{method: "GET", path: jobPath})
	if status != http.StatusOK {
		t.Fatalf("GET %s: %d", jobPath, status)
	}
	token := csrfOf(t, page)
	other := controlplane.NewToken(controlplane.UserTokenPrefix)
	if _, err := f.st.CreateUserToken(context.Background(), "other", controlplane.HashToken(other), store.Audit{Actor: "test"}, f.clock.Now()); err != nil {
		t.Fatal(err)
	}
	_, otherPage, _ := f.admin(adminRequest{method: "GET", path: jobPath, token: other})
	if csrfOf(t, otherPage) == token {
		t.Fatal("two user tokens get the same CSRF token")
	}

	cancel := jobPath + "/cancel"
	sameOrigin := map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": f.url}
	refused := []struct {
		name   string
		req    adminRequest
		status int
	}{
		{"no CSRF token", adminRequest{method: "POST", path: cancel, form: url.Values{}, header: sameOrigin}, http.StatusForbidden},
		{"a wrong CSRF token", adminRequest{method: "POST", path: cancel, form: url.Values{"csrf": {"x" + token}}, header: sameOrigin}, http.StatusForbidden},
		{"another user token's CSRF token", adminRequest{method: "POST", path: cancel, form: url.Values{"csrf": {token}}, header: sameOrigin, token: other}, http.StatusForbidden},
		{"a cross-site form with the right token", adminRequest{method: "POST", path: cancel, form: url.Values{"csrf": {token}},
			header: map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "http://evil.example"}}, http.StatusForbidden},
		{"another origin, no fetch metadata", adminRequest{method: "POST", path: cancel, form: url.Values{"csrf": {token}},
			header: map[string]string{"Origin": "http://evil.example"}}, http.StatusForbidden},
		{"a same-site page on another port", adminRequest{method: "POST", path: cancel, form: url.Values{"csrf": {token}},
			header: map[string]string{"Sec-Fetch-Site": "same-site"}}, http.StatusForbidden},
		{"the /v1 cancel with Basic credentials", adminRequest{method: "POST", path: "/v1/jobs/" + j.ID + "/cancel"}, http.StatusUnauthorized},
		{"the /v1 lose with Basic credentials", adminRequest{method: "POST", path: "/v1/admin/conversations/" + c.ID + "/lose"}, http.StatusUnauthorized},
		{"the /v1 cancel from another site, bearer", adminRequest{method: "POST", path: "/v1/jobs/" + j.ID + "/cancel", bearer: true,
			header: map[string]string{"Sec-Fetch-Site": "cross-site"}}, http.StatusForbidden},
		{"the lose form from another site", adminRequest{method: "POST", path: "/admin/conversations/" + c.ID + "/lose", form: url.Values{"csrf": {token}},
			header: map[string]string{"Sec-Fetch-Site": "cross-site"}}, http.StatusForbidden},
	}
	for _, tc := range refused {
		if status, body, _ := f.admin(tc.req); status != tc.status {
			t.Fatalf("%s: HTTP %d, want %d: %s", tc.name, status, tc.status, body)
		}
		if got := f.job(j.ID); got.State != wire.JobQueued || got.CancelRequested {
			t.Fatalf("%s: the job was changed: %+v", tc.name, got)
		}
		if got, _ := f.st.GetConversation(context.Background(), c.ID); got.State != wire.ConversationUsable {
			t.Fatalf("%s: the conversation was changed: %+v", tc.name, got)
		}
	}

	// The page's own form: same origin, its token. A 303 back to the job.
	status, _, h := f.admin(adminRequest{method: "POST", path: cancel, form: url.Values{"csrf": {token}}, header: sameOrigin})
	if status != http.StatusSeeOther || h.Get("Location") != jobPath {
		t.Fatalf("the page's own cancel form: HTTP %d to %q", status, h.Get("Location"))
	}
	if got := f.job(j.ID); got.State != wire.JobCancelled {
		t.Fatalf("after the page's own cancel form the job is %s", got.State)
	}
	// A tool with a Bearer header and no browser headers is not a browser: let in.
	j2 := f.send(c.ID, "again")
	f.expect("POST", "/v1/jobs/"+j2.ID+"/cancel", userToken, "", http.StatusOK, "")
	// A form already answered says why, in words, with its status.
	status, body, _ := f.admin(adminRequest{method: "POST", path: cancel, form: url.Values{"csrf": {token}}, header: sameOrigin})
	if status != http.StatusGone || !strings.Contains(body, "already ended") {
		t.Fatalf("cancelling an ended job from its page: HTTP %d: %s", status, body)
	}
}

// Admin → Jobs filters by state, conversation and the host that held a
// lease, and each page escapes what it shows.
func TestAdminJobsFilter(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	hostB := f.addHost("host-b")
	c1, c2 := f.newConversation(), f.newConversation()
	j1 := f.send(c1.ID, "one")
	j2 := f.send(c2.ID, "two")
	if a := f.claim(); a.JobID != j1.ID {
		t.Fatalf("host-a claimed %s, want %s", a.JobID, j1.ID)
	}
	if b, err := f.wc.Claim(ctx, hostB, wire.ClaimRequest{}); err != nil || b.JobID != j2.ID {
		t.Fatalf("host-b's claim: %+v, %v", b, err)
	}
	j3 := f.send(c1.ID, "three") // queued behind j1

	listed := func(query string) []string {
		t.Helper()
		status, page, _ := f.admin(adminRequest{method: "GET", path: "/admin/jobs?" + query})
		if status != http.StatusOK {
			t.Fatalf("GET /admin/jobs?%s: %d: %s", query, status, page)
		}
		var ids []string
		for _, m := range regexp.MustCompile(`data-job="([^"]+)"`).FindAllStringSubmatch(page, -1) {
			ids = append(ids, m[1])
		}
		return ids
	}
	for _, tc := range []struct {
		query string
		want  []string
	}{
		{"", []string{j3.ID, j2.ID, j1.ID}},
		{"state=running", []string{j2.ID, j1.ID}},
		{"state=queued", []string{j3.ID}},
		{"conversation=" + c1.ID, []string{j3.ID, j1.ID}},
		{"host=host-b", []string{j2.ID}},
		{"host=host-a&state=running", []string{j1.ID}},
		{"state=succeeded", nil},
	} {
		if got := listed(tc.query); strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Fatalf("Admin → Jobs ?%s lists %v, want %v", tc.query, got, tc.want)
		}
	}
	if status, _, _ := f.admin(adminRequest{method: "GET", path: "/admin/jobs?state=bogus"}); status != http.StatusBadRequest {
		t.Fatalf("an unknown state filter: HTTP %d, want 400", status)
	}
	status, page, _ := f.admin(adminRequest{method: "GET", path: "/admin/jobs?host=" + url.QueryEscape(`"><script>x</script>`)})
	if status != http.StatusOK || strings.Contains(page, "<script>") {
		t.Fatalf("the host filter is not escaped: %d\n%s", status, page)
	}
	if status, _, h := f.admin(adminRequest{method: "GET", path: "/admin/"}); status != http.StatusSeeOther || h.Get("Location") != "/admin/servers" {
		t.Fatalf("/admin/: HTTP %d to %q", status, h.Get("Location"))
	}
}

// TestS5CauseOnTheJobPage: a failed turn's cause and its evidence, as its
// runner reported them, are on the job's JSON and its Admin page.
func TestS5CauseOnTheJobPage(t *testing.T) {
	f := newFixture(t)
	f.send(f.newConversation().ID, "hog")
	c := f.claim()
	const ev = "cgroup v1 memory/memory.oom_control oom_kill 0→1 during the turn; the agent was ended by SIGKILL"
	if _, err := f.wc.Finish(context.Background(), c.WorkerToken, c.JobID, wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeFailed,
		Class: "agent_signal_KILL", Cause: wire.CauseOOMKilled, CauseEvidence: ev}); err != nil {
		t.Fatal(err)
	}
	if j := f.job(c.JobID); j.Cause != wire.CauseOOMKilled || j.CauseEvidence != ev {
		t.Fatalf("job JSON: cause %q (%q), want oom_killed with its evidence", j.Cause, j.CauseEvidence)
	}
	status, page, _ := f.admin(adminRequest{method: "GET", path: "/admin/jobs/" + c.JobID})
	if status != http.StatusOK || !strings.Contains(page, "<code>oom_killed</code>: "+ev) {
		t.Fatalf("GET the job page: %d, no cause with its evidence:\n%s", status, page)
	}
}

// Mark lost from Admin → Conversations, on each database: its link opens a
// page naming the conversation (title and id) with a form whose typed id
// the server compares; without it, or with another conversation's id, the
// form is refused 400 in a page saying so and nothing changes (whatever
// the browser ran); with it, the conversation is LOST.
func TestAdminMarkLostConfirmation(t *testing.T) {
	onEachDatabase(t, func(t *testing.T, db database) {
		f := newFixtureOn(t, db)
		var c, other wire.Conversation
		for _, p := range []struct {
			title string
			into  *wire.Conversation
		}{{"Nightly build <check>", &c}, {"Another one", &other}} {
			f.user(http.MethodPost, "/v1/conversations", wire.CreateConversationRequest{Title: p.title, Image: "demo:latest",
				AgentCommand: []string{"demo-agent"}}, p.into)
		}
		_, list, _ := f.admin(adminRequest{method: "GET", path: "/admin/conversations"})
		confirmPath := "/admin/conversations/" + c.ID + "/lose"
		if !strings.Contains(list, `href="`+confirmPath+`"`) || strings.Contains(list, `action="`+confirmPath+`"`) {
			t.Fatalf("Admin → Conversations does not link Mark lost to its confirmation, or still posts it in one click:\n%s", list)
		}
		status, page, h := f.admin(adminRequest{method: "GET", path: confirmPath})
		if status != http.StatusOK || !strings.Contains(page, "Nightly build &lt;check&gt;") || !strings.Contains(page, `id="conversation-id">`+c.ID+`<`) ||
			!strings.Contains(page, `name="confirm"`) || strings.Contains(page, `http-equiv="refresh"`) || !strings.HasPrefix(h.Get("Content-Type"), "text/html") {
			t.Fatalf("the confirmation page: %d %s, not naming the conversation with a confirm field and no reload:\n%s", status, h.Get("Content-Type"), page)
		}
		token := csrfOf(t, page)
		sameOrigin := map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": f.url}
		for _, typed := range []url.Values{
			{"csrf": {token}},
			{"csrf": {token}, "confirm": {""}},
			{"csrf": {token}, "confirm": {other.ID}},
			{"csrf": {token}, "confirm": {" " + c.ID}},
			{"csrf": {token}, "confirm": {strings.ToUpper(c.ID)}},
		} {
			status, body, h := f.admin(adminRequest{method: "POST", path: confirmPath, form: typed, header: sameOrigin})
			if status != http.StatusBadRequest || !strings.HasPrefix(h.Get("Content-Type"), "text/html") ||
				!strings.Contains(body, "type its id exactly") || !strings.Contains(body, `href="`+confirmPath+`"`) {
				t.Fatalf("Mark lost with %v: %d %s, want 400 and a page saying why with a way back:\n%s", typed, status, h.Get("Content-Type"), body)
			}
			if got, _ := f.st.GetConversation(context.Background(), c.ID); got.State != wire.ConversationUsable {
				t.Fatalf("Mark lost with %v marked the conversation %s", typed, got.State)
			}
		}
		// The confirmation of one conversation does not lose another.
		if status, _, _ := f.admin(adminRequest{method: "POST", path: "/admin/conversations/" + other.ID + "/lose",
			form: url.Values{"csrf": {token}, "confirm": {c.ID}}, header: sameOrigin}); status != http.StatusBadRequest {
			t.Fatalf("Mark lost of %s confirmed with %s's id: %d, want 400", other.ID, c.ID, status)
		}
		// Confirmed, but no reason for the audit: refused, nothing changed.
		if status, body, _ := f.admin(adminRequest{method: "POST", path: confirmPath, form: url.Values{"csrf": {token}, "confirm": {c.ID}}, header: sameOrigin}); status != http.StatusBadRequest ||
			!strings.Contains(body, "reason is required") {
			t.Fatalf("Mark lost confirmed without a reason: %d, want 400 naming the reason:\n%s", status, body)
		}
		if got, _ := f.st.GetConversation(context.Background(), c.ID); got.State != wire.ConversationUsable {
			t.Fatalf("Mark lost without a reason marked the conversation %s", got.State)
		}
		status, _, h = f.admin(adminRequest{method: "POST", path: confirmPath, form: url.Values{"csrf": {token}, "confirm": {c.ID}, "reason": {"its host is gone"}}, header: sameOrigin})
		if status != http.StatusSeeOther || h.Get("Location") != "/admin/conversations" {
			t.Fatalf("Mark lost with its id typed: %d to %q", status, h.Get("Location"))
		}
		for id, want := range map[string]string{c.ID: wire.ConversationLost, other.ID: wire.ConversationUsable} {
			if got, _ := f.st.GetConversation(context.Background(), id); got.State != want {
				t.Fatalf("after Mark lost of %s, %s is %s, want %s", c.ID, id, got.State, want)
			}
		}
		if status, body, _ := f.admin(adminRequest{method: "GET", path: "/admin/conversations/conv_nope/lose"}); status != http.StatusNotFound ||
			!strings.Contains(body, `id="refusal"`) {
			t.Fatalf("the confirmation of a conversation that does not exist: %d\n%s", status, body)
		}
	})
}

// A bad filter on Admin → Jobs, on each database, is answered 400 with an
// HTML page naming what is wrong and a link back to the jobs list, never
// the API's JSON; the page takes the API's filters (an empty field of its
// form is no filter) and shows each job's conversation title.
func TestAdminJobsBadFilterPage(t *testing.T) {
	onEachDatabase(t, func(t *testing.T, db database) {
		f := newFixtureOn(t, db)
		var c wire.Conversation
		f.user(http.MethodPost, "/v1/conversations", wire.CreateConversationRequest{Title: "Tidy the docs", Image: "demo:latest",
			AgentCommand: []string{"demo-agent"}}, &c)
		j := f.send(c.ID, "please")
		for _, tc := range []struct{ query, says string }{
			{"state=bogus", "state must be one of queued, running, succeeded, failed, cancelled."},
			{"outcome=maybe", "outcome must be one of succeeded, failed, cancelled."},
			{"colour=red", "colour is not a filter of Admin → Jobs"},
			{"since=yesterday", "since must be a time"},
			{"limit=-1", "limit must be a whole number"},
			{"cursor=abc", "cursor must be the next_cursor"},
			{"class=" + url.QueryEscape("a b"), "class is an error class"},
		} {
			status, body, h := f.admin(adminRequest{method: "GET", path: "/admin/jobs?" + tc.query})
			if status != http.StatusBadRequest || !strings.HasPrefix(h.Get("Content-Type"), "text/html") || strings.HasPrefix(strings.TrimSpace(body), "{") {
				t.Fatalf("?%s: %d %s, want 400 text/html:\n%s", tc.query, status, h.Get("Content-Type"), body)
			}
			if !strings.Contains(body, "<h1>Bad filter</h1>") || !strings.Contains(body, html.EscapeString(tc.says)) ||
				!strings.Contains(body, `<a id="back" href="/admin/jobs">`) {
				t.Fatalf("?%s: the page does not say %q with a link back:\n%s", tc.query, tc.says, body)
			}
		}
		status, body, _ := f.admin(adminRequest{method: "GET", path: "/admin/jobs?state=&outcome=&conversation=&host=&limit=5"})
		if status != http.StatusOK || !strings.Contains(body, `data-job="`+j.ID+`"`) || !strings.Contains(body, `<span class="conv-title">Tidy the docs</span>`) {
			t.Fatalf("the page's own empty form fields: %d, want the job with its conversation's title:\n%s", status, body)
		}
		// The API answers the same refusal as JSON.
		if b := f.expect("GET", "/v1/jobs?colour=red", userToken, "", http.StatusBadRequest, wire.CodeInvalid); !strings.Contains(string(b), "colour is not a filter of GET /v1/jobs") {
			t.Fatalf("GET /v1/jobs?colour=red: %s", b)
		}
	})
}
