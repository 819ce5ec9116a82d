package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/wire"
)

// auditList runs `controlplane audit list`: GET /v1/admin/audit with the
// user token, its filters as flags of the same names; the server judges
// them (a bad one is its 400, shown with its message, exit 1) so that the
// CLI and the API refuse the same things.
func auditList(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f := newFlags("audit list", stderr)
	api := addAPIFlags(f)
	output := f.fs.String("output", "table", "table or json")
	filters := map[string]*string{
		"target": f.fs.String("target", "", "only rows of this host name, conversation id or token id"),
		"action": f.fs.String("action", "", "only rows of this action (e.g. "+wire.AuditHostPause+")"),
		"since":  f.fs.String("since", "", "only rows at or after this RFC 3339 time"),
	}
	limit := f.fs.Int("limit", 0, "rows per page (1 to 500; default the server's 100)")
	all := f.fs.Bool("all", false, "follow next_cursor through every page")
	if err := f.parse(args); err != nil {
		return err
	}
	if f.fs.NArg() > 0 {
		return usagef("unexpected argument %q", f.fs.Arg(0))
	}
	if *output != "table" && *output != "json" {
		return usagef("--output must be table or json, not %q", *output)
	}
	c, token, err := api.client(getenv, 30*time.Second)
	if err != nil {
		return err
	}
	q := url.Values{}
	for name, v := range filters {
		if *v != "" {
			q.Set(name, *v)
		}
	}
	if *limit != 0 {
		q.Set("limit", strconv.Itoa(*limit))
	}
	var listed []wire.AuditEntry
	for {
		var page wire.AuditList
		path := controlplane.PathAdminAudit
		if len(q) > 0 {
			path += "?" + q.Encode()
		}
		if _, err := c.Do(ctx, http.MethodGet, path, token, nil, &page); err != nil {
			return fmt.Errorf("list the audit: %w", err)
		}
		listed = append(listed, page.Entries...)
		if !*all || page.NextCursor == "" {
			if *output == "json" {
				page.Entries = listed
				return json.NewEncoder(stdout).Encode(page)
			}
			w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "AT\tACTOR\tACTION\tTARGET\tREASON")
			for _, e := range listed {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", e.At.UTC().Format(time.RFC3339), e.Actor, e.Action, e.Target, oneLine(e.Reason))
			}
			if err := w.Flush(); err != nil {
				return err
			}
			if page.NextCursor != "" {
				fmt.Fprintf(stderr, "more rows follow: --all lists them (or the API's cursor=%s)\n", page.NextCursor)
			}
			return nil
		}
		q.Set("cursor", page.NextCursor)
	}
}
