package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// errTurnFailed is a turn that ended other than succeeded; submit has
// printed how.
var errTurnFailed = errors.New("the turn did not succeed")

// Following a turn: each request holds up to followWait; transport
// trouble is retried up to followGiveUp in a row.
const (
	followWait   = 25 * time.Second
	followGiveUp = 2 * time.Minute
)

func submit(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f := newFlags("submit", stderr)
	api := addAPIFlags(f)
	convID := f.fs.String("conversation", "", "conversation to send the message to")
	newConv := f.fs.Bool("new", false, "start a new conversation (with --image and --agent)")
	title := f.fs.String("title", "", "title of a new conversation")
	image := f.fs.String("image", "", "sandbox image of a new conversation")
	sandbox := f.fs.String("sandbox", "", "sandbox backend a new conversation needs: docker or process (default: any host)")
	require := f.fs.String("require", "", "labels a host must have to take a new conversation's turns: key=value,key=value")
	limit := f.fs.String("limit", "", "resource limits of a new conversation's sandbox: cpus=N,memory_bytes=N,pids=N (each optional; the host's own limits where absent or lower)")
	protocol := f.fs.String("agent-protocol", "", "how a new conversation's agent is spoken to: lines (default) or acp")
	permission := f.fs.String("permission-policy", "", "how a new ACP conversation answers permission requests: allow, reject or ask (default ask)")
	agent := f.fs.String("agent", "", `agent command of a new conversation, split at spaces (or give its argv after "--")`)
	prompt := f.fs.String("prompt", "", `the message; "-" reads it from standard input`)
	follow := f.fs.Bool("follow", true, "follow the turn's events until it ends")
	asJSON := f.fs.Bool("json", false, "print events as JSON lines")
	if err := f.parse(args); err != nil {
		return err
	}
	argv := strings.Fields(*agent)
	argv = append(argv, f.fs.Args()...)
	switch {
	case *newConv == (*convID != ""):
		return usagef("give either --conversation ID or --new")
	case *newConv && len(argv) == 0:
		return usagef("--new needs --agent CMD (or the agent's argv after --)")
	case !*newConv && (len(argv) > 0 || *image != "" || *title != "" || *sandbox != "" || *require != "" || *protocol != "" || *permission != "" || *limit != ""):
		return usagef("--agent, --image, --title, --agent-protocol, --permission-policy, --limit, --sandbox and --require are for --new conversations only")
	case *prompt == "":
		return usagef("--prompt is required")
	}
	requires, err := wire.ParseLabels(*require)
	if err != nil {
		return usagef("--require %q: %v", *require, err)
	}
	limits, err := wire.ParseLimits(*limit)
	if err != nil {
		return usagef("--limit %q: %v", *limit, err)
	}
	if *prompt == "-" {
		b, err := io.ReadAll(io.LimitReader(os.Stdin, wire.MaxBodyBytes))
		if err != nil {
			return fmt.Errorf("read the prompt: %w", err)
		}
		*prompt = string(b)
	}
	c, token, err := api.client(getenv, followWait+30*time.Second)
	if err != nil {
		return err
	}
	call := func(method, path string, body, out any) error {
		_, err := c.Do(ctx, method, path, token, body, out)
		return err
	}
	if *newConv {
		var conv wire.Conversation
		if err := call(http.MethodPost, "/v1/conversations", wire.CreateConversationRequest{
			Title: *title, Image: *image, AgentCommand: argv, Sandbox: *sandbox, Requires: requires,
			AgentProtocol: *protocol, PermissionPolicy: *permission, Limits: limits,
		}, &conv); err != nil {
			return fmt.Errorf("create the conversation: %w", err)
		}
		*convID = conv.ID
	}
	fmt.Fprintf(stdout, "conversation %s\n", *convID)
	var job wire.Job
	if err := call(http.MethodPost, "/v1/conversations/"+url.PathEscape(*convID)+"/messages",
		wire.SendMessageRequest{Prompt: *prompt}, &job); err != nil {
		var se *wire.StatusError
		if errors.As(err, &se) && se.Code == wire.CodeConversationLost {
			fmt.Fprintln(stderr, "This conversation is no longer available; start a new one with --new.")
			return errTurnFailed
		}
		if errors.As(err, &se) && se.Status == http.StatusGone {
			fmt.Fprintln(stderr, "This conversation was deleted; start a new one with --new.")
			return errTurnFailed
		}
		return fmt.Errorf("send the message: %w", err)
	}
	fmt.Fprintf(stdout, "job %s (turn %d)\n", job.ID, job.Seq)
	if !*follow {
		return nil
	}

	if err := followEvents(ctx, call, job.ID, 0, func(e wire.JobEvent) { printEvent(stdout, e, *asJSON) }); err != nil {
		return err
	}

	if err := call(http.MethodGet, "/v1/jobs/"+url.PathEscape(job.ID), nil, &job); err != nil {
		return fmt.Errorf("read job %s: %w", job.ID, err)
	}
	line := fmt.Sprintf("turn %d: %s", job.Seq, job.State)
	if job.Reason != "" {
		line += ": " + job.Reason
	}
	fmt.Fprintln(stdout, line)
	if job.State == wire.JobSucceeded {
		return nil
	}
	var conv wire.Conversation
	if err := call(http.MethodGet, "/v1/conversations/"+url.PathEscape(*convID), nil, &conv); err == nil && conv.State == wire.ConversationLost {
		fmt.Fprintf(stdout, "conversation %s: %s\n", conv.ID, conv.LostReason)
	}
	return errTurnFailed
}

// userToken finds the user token: --user-token-file if given, else
// $CONTROLPLANE_USER_TOKEN, else the file named by $CONTROLPLANE_USER_TOKEN_FILE or
// DATA-DIR/user-token. A token never travels in argv.
func userToken(f *flags, file string, getenv func(string) string, dataDir string) (string, error) {
	if !f.onCommandLine("user-token-file") {
		if tok := strings.TrimSpace(getenv(envUserToken)); tok != "" {
			return tok, nil
		}
	}
	if file == "" {
		file = filepath.Join(dataDir, "user-token")
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("read the user token (set --user-token-file or %s): %w", envUserToken, err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("the user token file %s is empty", file)
	}
	return tok, nil
}

func printEvent(w io.Writer, e wire.JobEvent, asJSON bool) {
	if asJSON {
		b, _ := json.Marshal(e)
		fmt.Fprintf(w, "%s\n", b)
		return
	}
	line := fmt.Sprintf("%s %-7s %s", e.Time.UTC().Format("15:04:05.000"), e.Source, e.Type)
	if len(e.Data) > 0 {
		line += " " + string(e.Data)
	}
	fmt.Fprintln(w, line)
}

// followEvents prints each event of job after the event id after, in
// order, until the job has ended and every event was returned; a control
// plane that cannot be reached is asked again every 2 s for up to
// followGiveUp, and a cancelled ctx stops following (not the job).
func followEvents(ctx context.Context, call func(method, path string, body, out any) error, jobID string, after int64, print func(wire.JobEvent)) error {
	var failingSince time.Time
	for {
		var page wire.JobEventList
		path := fmt.Sprintf("/v1/jobs/%s/events?after=%d&wait_ms=%d", url.PathEscape(jobID), after, followWait.Milliseconds())
		err := call(http.MethodGet, path, nil, &page)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("stopped following; job %s goes on", jobID)
			}
			if wire.Classify(err) != wire.Transient {
				return fmt.Errorf("follow job %s: %w", jobID, err)
			}
			if failingSince.IsZero() {
				failingSince = time.Now()
			} else if time.Since(failingSince) > followGiveUp {
				return fmt.Errorf("follow job %s: the control plane stays unreachable: %w", jobID, err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(2 * time.Second):
			}
			continue
		}
		failingSince = time.Time{}
		for _, e := range page.Events {
			print(e)
			after = e.ID
		}
		if page.Ended {
			return nil
		}
	}
}
