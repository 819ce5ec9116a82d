package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// conversation runs `controlplane conversation delete ID`, through the
// user API with the user token (S3).
func conversation(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "delete" {
		return usagef(`"conversation" takes a subcommand: delete`)
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
