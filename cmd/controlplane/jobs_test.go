package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/runnerd/runnerd/wire"
)

// `controlplane jobs` reads and cancels jobs through the user API of a
// real serve: list (table and JSON, filtered, every page with --all),
// show, cancel of a queued job, events; a bad filter shows the server's
// sentence, a bad --output or a missing JOB is a usage error.
func TestJobsCommands(t *testing.T) {
	dir := t.TempDir()
	r := startServe(t, "--data-dir", dir)
	common := []string{"--server", r.addr, "--data-dir", dir}
	var ids []string
	for _, prompt := range []string{"one", "two", "three"} {
		code, stdout, stderr := runCmd(t, noEnv, append([]string{"submit", "--new", "--agent", "demoagent", "--prompt", prompt, "--follow=false"}, common...)...)
		_, job, ok := strings.Cut(stdout, "job ")
		if code != exitOK || !ok {
			t.Fatalf("submit: exit %d, %q, %s", code, stdout, stderr)
		}
		ids = append(ids, strings.Fields(job)[0])
	}
	jobsJSON := func(args ...string) wire.JobList {
		t.Helper()
		code, stdout, stderr := runCmd(t, noEnv, append(append([]string{"jobs", "list", "--output", "json"}, args...), common...)...)
		var l wire.JobList
		if code != exitOK || json.Unmarshal([]byte(stdout), &l) != nil {
			t.Fatalf("jobs list %v: exit %d, %q, %s", args, code, stdout, stderr)
		}
		return l
	}
	if l := jobsJSON(); len(l.Jobs) != 3 || l.Jobs[0].ID != ids[2] || l.Jobs[2].ID != ids[0] {
		t.Errorf("jobs list: %+v, want the three jobs newest first", l.Jobs)
	}
	if l := jobsJSON("--limit", "1"); len(l.Jobs) != 1 || l.NextCursor == "" {
		t.Errorf("jobs list --limit 1: %d jobs, cursor %q; want one and a cursor", len(l.Jobs), l.NextCursor)
	}
	if l := jobsJSON("--limit", "1", "--all"); len(l.Jobs) != 3 || l.NextCursor != "" {
		t.Errorf("jobs list --limit 1 --all: %d jobs, cursor %q; want all three", len(l.Jobs), l.NextCursor)
	}

	code, stdout, stderr := runCmd(t, noEnv, append([]string{"jobs", "cancel", ids[1]}, common...)...)
	if code != exitOK || !strings.Contains(stdout, "job "+ids[1]) || !strings.Contains(stdout, wire.JobCancelled) {
		t.Fatalf("jobs cancel: exit %d, %q, %s", code, stdout, stderr)
	}
	if l := jobsJSON("--state", "cancelled"); len(l.Jobs) != 1 || l.Jobs[0].ID != ids[1] {
		t.Errorf("jobs list --state cancelled: %+v, want the cancelled job", l.Jobs)
	}
	code, stdout, _ = runCmd(t, noEnv, append([]string{"jobs", "list"}, common...)...)
	if lines := strings.Split(strings.TrimSpace(stdout), "\n"); code != exitOK || len(lines) != 4 || !strings.HasPrefix(lines[0], "JOB") || !strings.HasPrefix(lines[1], ids[2]) {
		t.Errorf("jobs list (table): exit %d\n%s", code, stdout)
	}
	code, stdout, _ = runCmd(t, noEnv, append([]string{"jobs", "show", ids[0]}, common...)...)
	if code != exitOK || !strings.HasPrefix(stdout, "job "+ids[0]+": turn 1 of conversation conv_") || !strings.Contains(stdout, "queued") {
		t.Errorf("jobs show: exit %d\n%s", code, stdout)
	}
	// The cancelled job has ended: --follow prints its events and returns.
	code, stdout, stderr = runCmd(t, noEnv, append([]string{"jobs", "events", ids[1], "--follow"}, common...)...)
	if code != exitOK || !strings.Contains(stdout, " queued") || !strings.Contains(stdout, " cancelled") {
		t.Errorf("jobs events --follow of an ended job: exit %d, %q, %s", code, stdout, stderr)
	}
	code, stdout, _ = runCmd(t, noEnv, append([]string{"jobs", "events", ids[0], "--output", "json"}, common...)...)
	var ev wire.JobEvent
	if first, _, _ := strings.Cut(stdout, "\n"); code != exitOK || json.Unmarshal([]byte(first), &ev) != nil || ev.Type != "queued" || ev.JobID != ids[0] {
		t.Errorf("jobs events --output json: exit %d, %q", code, stdout)
	}

	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"jobs", "list", "--state", "lost"}, exitFail, "HTTP 400 invalid: state must be one of"},
		{[]string{"jobs", "show", "job_nosuchjob"}, exitFail, "HTTP 404 not_found: "},
		{[]string{"jobs", "list", "--output", "yaml"}, exitUsage, `--output must be table or json, not "yaml"`},
		{[]string{"jobs", "show"}, exitUsage, "missing the JOB id"},
		{[]string{"jobs", "delete", "x"}, exitUsage, `"jobs" takes a subcommand: list, show, cancel or events`},
	} {
		code, _, stderr := runCmd(t, noEnv, append(tc.args, common...)...)
		if code != tc.code || !strings.Contains(stderr, tc.says) {
			t.Errorf("%v: exit %d, %q; want exit %d and %q", tc.args, code, stderr, tc.code, tc.says)
		}
	}
}
