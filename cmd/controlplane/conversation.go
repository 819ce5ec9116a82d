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
	server := f.fs.String("server", "http://127.0.0.1:8080", "control plane URL")
	dataDir := f.fs.String("data-dir", "data", "data directory of the control plane, for its user token")
	tokenFile := f.fs.String("user-token-file", "", "file holding the user token (default DATA-DIR/user-token; env CONTROLPLANE_USER_TOKEN holds the token itself)")
	caFile := f.fs.String("ca-file", "", "PEM CA to trust beside the system's, for an https:// --server")
	asJSON := f.fs.Bool("json", false, "print the deleted conversation as JSON")
	id, err := oneArg(f, args[1:], "the conversation's ID")
	if err != nil {
		return err
	}
	u, err := url.Parse(*server)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usagef("--server must be an http:// or https:// URL")
	}
	token, err := userToken(f, *tokenFile, getenv, *dataDir)
	if err != nil {
		return err
	}
	tr, err := clientTransport(*caFile)
	if err != nil {
		return err
	}
	c := &wire.Client{BaseURL: *server, HTTP: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
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
