package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// jobCommands are `controlplane jobs …`: the user API's jobs, with the
// user token, never the database.
var jobCommands = map[string]string{
	"list":   "list jobs, newest first, by state, outcome, class, host, conversation or time",
	"show":   "show one job and its attempts",
	"cancel": "cancel a job: a queued one ends at once, a running one at its next renewal",
	"events": "print a job's events; --follow waits for new ones until the job ends",
}

// jobs runs one of jobCommands.
func jobs(ctx context.Context, sub string, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	usage := "jobs " + sub + " JOB"
	if sub == "list" {
		usage = "jobs list"
	}
	f := newFlags(usage, stderr)
	api := addAPIFlags(f)
	output := f.fs.String("output", "table", "table or json")
	var filters map[string]*string
	var limit *int
	var all, follow *bool
	switch sub {
	case "list":
		filters = map[string]*string{}
		for _, name := range []string{"state", "outcome", "class", "host", "conversation", "since"} {
			filters[name] = f.fs.String(name, "", "only jobs of this "+name+" (GET /v1/jobs?"+name+"=)")
		}
		limit = f.fs.Int("limit", 0, "jobs per page (1 to 500; default the server's 100)")
		all = f.fs.Bool("all", false, "follow next_cursor through every page")
	case "events":
		follow = f.fs.Bool("follow", false, "wait for new events until the job ends")
	}
	var jobID string
	if sub == "list" {
		if err := f.parse(args); err != nil {
			return err
		}
		if f.fs.NArg() > 0 {
			return usagef("unexpected argument %q", f.fs.Arg(0))
		}
	} else {
		var err error
		if jobID, err = oneArg(f, args, "the JOB id"); err != nil {
			return err
		}
	}
	if *output != "table" && *output != "json" {
		return usagef("--output must be table or json, not %q", *output)
	}
	asJSON := *output == "json"
	c, token, err := api.client(getenv, followWait+30*time.Second)
	if err != nil {
		return err
	}
	call := func(method, path string, body, out any) error {
		_, err := c.Do(ctx, method, path, token, body, out)
		return err
	}
	jobPath := "/v1/jobs/" + url.PathEscape(jobID)

	switch sub {
	case "list":
		q := url.Values{}
		for name, v := range filters {
			if *v != "" {
				q.Set(name, *v)
			}
		}
		if *limit != 0 {
			q.Set("limit", strconv.Itoa(*limit))
		}
		var listed []wire.Job
		for {
			var page wire.JobList
			path := "/v1/jobs"
			if len(q) > 0 {
				path += "?" + q.Encode()
			}
			if err := call(http.MethodGet, path, nil, &page); err != nil {
				return fmt.Errorf("list jobs: %w", err)
			}
			listed = append(listed, page.Jobs...)
			if !*all || page.NextCursor == "" {
				if asJSON {
					page.Jobs = listed
					return json.NewEncoder(stdout).Encode(page)
				}
				printJobs(stdout, listed, time.Now())
				if page.NextCursor != "" {
					fmt.Fprintf(stderr, "more jobs follow: --all lists them (or the API's cursor=%s)\n", page.NextCursor)
				}
				return nil
			}
			q.Set("cursor", page.NextCursor)
		}
	case "show", "cancel":
		var j wire.Job
		method, path := http.MethodGet, jobPath
		if sub == "cancel" {
			method, path = http.MethodPost, jobPath+"/cancel"
		}
		if err := call(method, path, nil, &j); err != nil {
			return fmt.Errorf("%s job %s: %w", sub, jobID, err)
		}
		if asJSON {
			return json.NewEncoder(stdout).Encode(j)
		}
		printJob(stdout, j)
		return nil
	}
	// events
	print := func(e wire.JobEvent) { printEvent(stdout, e, asJSON) }
	if *follow {
		return followEvents(ctx, call, jobID, 0, print)
	}
	var after int64
	for {
		var page wire.JobEventList
		if err := call(http.MethodGet, fmt.Sprintf("%s/events?after=%d", jobPath, after), nil, &page); err != nil {
			return fmt.Errorf("events of job %s: %w", jobID, err)
		}
		for _, e := range page.Events {
			print(e)
			after = e.ID
		}
		if page.Ended || len(page.Events) == 0 {
			return nil
		}
	}
}

// printJobs is the table of `jobs list`.
func printJobs(w io.Writer, jobs []wire.Job, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB\tCONVERSATION\tTURN\tSTATE\tHOST\tCREATED\tREASON")
	for _, j := range jobs {
		host := ""
		if n := len(j.Attempts); n > 0 {
			host = j.Attempts[n-1].LeaseOwner
		}
		state := j.State
		if j.CancelRequested && j.EndedAt == nil {
			state += " (cancel requested)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s ago\t%s\n", j.ID, j.ConversationID, j.Seq, state, host,
			now.Sub(j.CreatedAt).Truncate(time.Second), oneLine(j.Reason))
	}
	tw.Flush()
}

// printJob is `jobs show`: the job, then its attempts.
func printJob(w io.Writer, j wire.Job) {
	fmt.Fprintf(w, "job %s: turn %d of conversation %s, %s", j.ID, j.Seq, j.ConversationID, j.State)
	if j.Outcome != "" && j.Outcome != j.State {
		fmt.Fprintf(w, " (%s)", j.Outcome)
	}
	fmt.Fprintln(w)
	if j.Reason != "" {
		fmt.Fprintf(w, "  %s\n", oneLine(j.Reason))
	}
	if j.CancelRequested && j.EndedAt == nil {
		fmt.Fprintln(w, "  cancel requested")
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ATTEMPT\tGENERATION\tSTATE\tHOST\tCLAIMED\tENDED\tOUTCOME")
	for _, a := range j.Attempts {
		ended := ""
		if a.EndedAt != nil {
			ended = a.EndedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", a.ID, a.Generation, a.State, a.LeaseOwner,
			a.ClaimedAt.UTC().Format(time.RFC3339), ended, a.Outcome)
	}
	tw.Flush()
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
