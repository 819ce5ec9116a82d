package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// permit answers a pending ACP permission request of a running job:
// controlplane permit JOB REQUEST OPTION. The server's refusal is shown in
// its own words (not pending, not one of the options, no such job).
func permit(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f := newFlags("permit JOB REQUEST OPTION", stderr)
	api := addAPIFlags(f)
	asJSON := f.fs.Bool("json", false, "print the job as JSON")
	if err := f.parse(args); err != nil {
		return err
	}
	pos := f.fs.Args()
	if len(pos) != 3 {
		return usagef("want JOB REQUEST OPTION (the request and its options are on the job's page and in its pending_permissions), got %d argument(s)", len(pos))
	}
	job, request, option := pos[0], pos[1], pos[2]
	c, token, err := api.client(getenv, 30*time.Second)
	if err != nil {
		return err
	}
	var j wire.Job
	path := "/v1/jobs/" + url.PathEscape(job) + "/permissions/" + url.PathEscape(request)
	if _, err := c.Do(ctx, http.MethodPost, path, token, wire.PermissionAnswer{OptionID: option}, &j); err != nil {
		return fmt.Errorf("answer request %s of job %s: %w", request, job, err)
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(j)
	}
	fmt.Fprintf(stdout, "request %s of job %s answered %s; the agent gets it with the turn's next poll\n", request, job, option)
	return nil
}
