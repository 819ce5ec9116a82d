package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// hostCommands are `controlplane host …` besides add: they go through the
// control plane's admin API with the user token, never to the database.
var hostCommands = map[string]string{
	"list":         "list the hosts with their state",
	"pause":        "stop giving a host new turns; its running turns go on",
	"resume":       "give a paused host turns again",
	"rotate-token": "give a host a new token: it picks it up from its next heartbeat answer, the old one is refused at the end of --grace (0: now, the new token shown once)",
	"remove":       "remove a host: its token is refused from then on",
}

// hostAdmin runs one of hostCommands.
func hostAdmin(ctx context.Context, sub string, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	usage := "host " + sub + " NAME"
	if sub == "list" {
		usage = "host list"
	}
	f := newFlags(usage, stderr)
	api := addAPIFlags(f)
	asJSON := f.fs.Bool("json", false, "print the answer as JSON")
	var reason *string
	if sub != "list" {
		what := "why (recorded in the audit with your token's name)"
		if sub == "remove" {
			what += "; required"
		}
		reason = f.fs.String("reason", "", what)
	}
	var grace *time.Duration
	if sub == "rotate-token" {
		grace = f.fs.Duration("grace", wire.DefaultRotateGrace, "how long the old token stays valid; the host picks the new one up from its next heartbeat answer meanwhile (0: the new token replaces it now and is shown once)")
	}
	var name string
	if sub == "list" {
		if err := f.parse(args); err != nil {
			return err
		}
		if f.fs.NArg() > 0 {
			return usagef("unexpected argument %q", f.fs.Arg(0))
		}
	} else {
		var err error
		if name, err = oneArg(f, args, "the host's NAME"); err != nil {
			return err
		}
		if err := checkHostName(name); err != nil {
			return err
		}
		if sub == "remove" && strings.TrimSpace(*reason) == "" {
			return usagef("--reason is required: say why host %s is removed (the audit records it)", name)
		}
		if len(*reason) > wire.MaxAuditReason {
			return usagef("--reason is at most %d bytes", wire.MaxAuditReason)
		}
	}
	c, token, err := api.client(getenv, 30*time.Second)
	if err != nil {
		return err
	}

	switch sub {
	case "list":
		var list wire.ServerList
		if _, err := c.Do(ctx, http.MethodGet, "/v1/admin/servers", token, nil, &list); err != nil {
			return fmt.Errorf("list hosts: %w", err)
		}
		if *asJSON {
			return json.NewEncoder(stdout).Encode(list)
		}
		printHosts(stdout, list.Servers, time.Now())
		return nil
	case "rotate-token":
		if *grace < 0 {
			return usagef("--grace must not be negative")
		}
		ms := grace.Milliseconds()
		var tr wire.HostTokenResponse
		if _, err := c.Do(ctx, http.MethodPost, hostPath(name, sub), token, wire.RotateTokenRequest{GraceMS: &ms, Reason: *reason}, &tr); err != nil {
			return fmt.Errorf("rotate the token of host %s: %w", name, err)
		}
		if tr.GraceUntil != nil {
			fmt.Fprintf(stderr, "host %s gets a new token from its next heartbeat answer (nobody else sees it); its current token is refused from %s\n",
				name, tr.GraceUntil.UTC().Format(time.RFC3339))
			return nil
		}
		fmt.Fprintln(stdout, tr.Token)
		fmt.Fprintf(stderr, "host %s has a new token, shown above once; its old token is refused from now on\n", name)
		return nil
	case "remove":
		if _, err := c.Do(ctx, http.MethodPost, hostPath(name, sub), token, wire.HostActionRequest{Reason: *reason}, nil); err != nil {
			return fmt.Errorf("remove host %s: %w", name, err)
		}
		fmt.Fprintf(stderr, "host %s removed; its token is refused from now on (its running turns keep their own tokens until they end)\n", name)
		return nil
	}
	var sv wire.Server
	if _, err := c.Do(ctx, http.MethodPost, hostPath(name, sub), token, wire.HostActionRequest{Reason: *reason}, &sv); err != nil {
		return fmt.Errorf("%s host %s: %w", sub, name, err)
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(sv)
	}
	printHosts(stdout, []wire.Server{sv}, time.Now())
	return nil
}

func hostPath(name, action string) string {
	return "/v1/admin/hosts/" + url.PathEscape(name) + "/" + action
}

// printHosts is the table of `host list`.
func printHosts(w io.Writer, servers []wire.Server, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATE\tLAST HEARTBEAT\tRUNNING\tNOTE")
	for _, s := range servers {
		last := "never"
		if s.LastHeartbeat != nil {
			last = now.Sub(*s.LastHeartbeat).Truncate(time.Second).String() + " ago"
		}
		var notes []string
		if s.PausedAt != nil && s.State != wire.HostPaused {
			notes = append(notes, "paused")
		}
		if s.ClaimsWithheld != "" {
			notes = append(notes, "claims withheld: "+s.ClaimsWithheld)
		}
		if p := s.SandboxPressure; p != nil {
			notes = append(notes, fmt.Sprintf("sandbox pressure: %s %d of %d bytes free, first turns withheld", p.Resource, p.FreeBytes, p.TotalBytes))
		}
		if s.LaunchError != nil {
			notes = append(notes, fmt.Sprintf("launch error %s ×%d", s.LaunchError.Class, s.LaunchError.Consecutive))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\n", s.Name, s.State, last, s.Running, s.Capacity, strings.Join(notes, "; "))
	}
	tw.Flush()
}
