package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// conversation runs `controlplane conversation delete ID` (S3) and
// `conversation lose ID --reason R` (mark it LOST: the host holding its
// sandbox is gone for good), through the API with the user token.
func conversation(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "delete" && args[0] != "lose") {
		return usagef(`"conversation" takes a subcommand: delete or lose`)
	}
	if args[0] == "lose" {
		return conversationLose(ctx, args[1:], getenv, stdout, stderr)
	}
	f := newFlags("conversation delete ID", stderr)
	api := addAPIFlags(f)
	asJSON := f.fs.Bool("json", false, "print the deleted conversation as JSON")
	id, err := oneArg(f, args[1:], "the conversation's ID")
	if err != nil {
		return err
	}
	c, token, err := api.client(getenv, 30*time.Second)
	if err != nil {
		return err
	}
	var conv wire.Conversation
	if _, err := c.Do(ctx, http.MethodDelete, "/v1/conversations/"+url.PathEscape(id), token, nil, &conv); err != nil {
		var se *wire.StatusError
		if errors.As(err, &se) && se.Code == wire.CodeConversationBusy {
			return fmt.Errorf("delete conversation %s: a turn of it is running or waiting; cancel it first (POST /v1/jobs/ID/cancel), then delete", id)
		}
		return fmt.Errorf("delete conversation %s: %w", id, err)
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(conv)
	}
	fmt.Fprintf(stdout, "conversation %s deleted; its host removes the sandbox at its next sweep\n", conv.ID)
	return nil
}

// conversationLose marks a conversation LOST on the operator's word
// (POST /v1/admin/conversations/{id}/lose): its waiting turns fail in plain
// words. --reason is required; the audit records it with the token's name.
func conversationLose(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f := newFlags("conversation lose ID --reason WHY", stderr)
	api := addAPIFlags(f)
	asJSON := f.fs.Bool("json", false, "print the conversation as JSON")
	reason := f.fs.String("reason", "", "why it is lost, e.g. which host is gone (required; recorded in the audit with your token's name)")
	id, err := oneArg(f, args, "the conversation's ID")
	if err != nil {
		return err
	}
	if strings.TrimSpace(*reason) == "" {
		return usagef("--reason is required: say why conversation %s is lost (the audit records it)", id)
	}
	if len(*reason) > wire.MaxAuditReason {
		return usagef("--reason is at most %d bytes", wire.MaxAuditReason)
	}
	c, token, err := api.client(getenv, 30*time.Second)
	if err != nil {
		return err
	}
	var conv wire.Conversation
	if _, err := c.Do(ctx, http.MethodPost, "/v1/admin/conversations/"+url.PathEscape(id)+"/lose", token, wire.LoseRequest{Reason: *reason}, &conv); err != nil {
		return fmt.Errorf("mark conversation %s lost: %w", id, err)
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(conv)
	}
	fmt.Fprintf(stdout, "conversation %s is %s: %s\n", conv.ID, conv.State, conv.LostReason)
	return nil
}
