package controlplane_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/wire"
)

// Admin → Audit in a real browser: reached from the nav, it lists the
// admin actions newest first with actor, action, target and reason — a
// pause through the API and a Mark lost from its confirmation page,
// whose reason field is required (the form refuses an empty one in
// words); the action filter narrows it; a bad filter is a page in words
// (400), not JSON.
func TestBrowserAdminAuditPage(t *testing.T) {
	tab := newTab(t)
	f := newFixture(t)
	f.expect(http.MethodPost, strings.ReplaceAll(controlplane.PathAdminHost, "{name}", "host-a")+"pause", userToken,
		`{"reason":"kernel <upgrade>"}`, http.StatusOK, "")
	conv := f.newConversation()

	// Mark lost from its confirmation page: refused without a reason, done
	// with one.
	confirmPage := f.url + "/admin/conversations/" + conv.ID + "/lose"
	run(t, tab, "open the confirmation", chromedp.Navigate(confirmPage), chromedp.WaitVisible(chromedp.CSS(`#confirm-lose`)))
	// The field is required in the page; without that the server refuses.
	run(t, tab, "drop the field's required", chromedp.RemoveAttribute(chromedp.CSS(`#lose input[name="reason"]`), "required", chromedp.NodeVisible),
		chromedp.SendKeys(chromedp.CSS(`#lose input[name="confirm"]`), conv.ID, chromedp.NodeVisible))
	if resp := click(t, tab, `#confirm-lose`); resp.Status != http.StatusBadRequest {
		t.Fatalf("Mark lost without a reason: %d", resp.Status)
	}
	contains(t, "the refusal", textOf(t, tab, "#refusal"), "reason is required")
	run(t, tab, "back to the confirmation", chromedp.Navigate(confirmPage),
		chromedp.SendKeys(chromedp.CSS(`#lose input[name="confirm"]`), conv.ID, chromedp.NodeVisible),
		chromedp.SendKeys(chromedp.CSS(`#lose input[name="reason"]`), "host-a's disk died", chromedp.NodeVisible))
	if resp := click(t, tab, `#confirm-lose`); resp.Status != http.StatusOK {
		t.Fatalf("Mark lost with a reason: %d", resp.Status)
	}
	row := `tr[data-conversation="` + conv.ID + `"]`
	run(t, tab, "open conversations", chromedp.Navigate(f.url+"/admin/conversations"), chromedp.WaitVisible(chromedp.CSS(row)))
	contains(t, "the conversation's row", textOf(t, tab, row), "Lost")

	// The nav's Audit link, the entries newest first.
	run(t, tab, "follow the nav's Audit link", chromedp.Navigate(f.url+"/admin/servers"),
		chromedp.Click(chromedp.CSS(`nav a[href="/admin/audit"]`), chromedp.NodeVisible), chromedp.WaitVisible(chromedp.CSS(`#audit`)))
	rows := get(t, tab, "read the entries", chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("#audit tr.audit-entry")).map(tr =>
		[".actor", ".action", ".target", ".reason"].map(c => tr.querySelector(c).innerText).join(" | "))`))
	want := []string{
		"test | " + wire.AuditConversationLose + " | " + conv.ID + " | host-a's disk died",
		"test | " + wire.AuditHostPause + " | host-a | kernel <upgrade>",
	}
	if len(rows) < len(want) || rows[0] != want[0] || rows[1] != want[1] {
		t.Fatalf("Admin → Audit reads %q; want it to start %q", rows, want)
	}
	contains(t, "the nav", textOf(t, tab, "nav a.here"), "Audit")
	screenshot(t, tab, "audit")

	// The action filter, then a bad filter.
	run(t, tab, "filter by host.pause", chromedp.Navigate(f.url+"/admin/audit?action="+wire.AuditHostPause), chromedp.WaitVisible(chromedp.CSS(`#audit`)))
	if n := get(t, tab, "count the entries", chromedp.Evaluate[int](`document.querySelectorAll("#audit tr.audit-entry").length`)); n != 1 {
		t.Fatalf("action=host.pause shows %d entries, want 1", n)
	}
	resp := get(t, tab, "open a bad filter", chromedp.NavigateResponse(f.url+"/admin/audit?since=yesterday"))
	if resp.Status != http.StatusBadRequest {
		t.Fatalf("a bad filter: %d, want 400", resp.Status)
	}
	contains(t, "the bad filter's page", textOf(t, tab, "#refusal"), "since must be a time")
}
