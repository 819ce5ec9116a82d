package fleet

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// User speaks the control plane's user API with its bearer token.
type User struct {
	c     *wire.Client
	tr    *http.Transport
	token string
}

// NewUser returns a user API client of the control plane at baseURL.
func NewUser(baseURL, token string) *User { return newUser(baseURL, token, nil) }

func newUser(baseURL, token string, tlsConfig *tls.Config) *User {
	tr := &http.Transport{TLSClientConfig: tlsConfig, MaxIdleConnsPerHost: 4, IdleConnTimeout: 30 * time.Second}
	return &User{c: &wire.Client{BaseURL: baseURL, HTTP: &http.Client{Transport: tr, Timeout: 30 * time.Second}}, tr: tr, token: token}
}

// Close closes the client's idle connections.
func (u *User) Close() { u.tr.CloseIdleConnections() }

func (u *User) call(ctx context.Context, method, path string, body, out any) error {
	_, err := u.c.Do(ctx, method, path, u.token, body, out)
	return err
}

// CreateConversation starts a conversation whose agent is argv, run by
// the process backend (the image is only informational there).
func (u *User) CreateConversation(ctx context.Context, title string, argv ...string) (wire.Conversation, error) {
	return u.Create(ctx, wire.CreateConversationRequest{Title: title, Image: "demo", AgentCommand: argv})
}

// Create starts a conversation.
func (u *User) Create(ctx context.Context, req wire.CreateConversationRequest) (wire.Conversation, error) {
	var c wire.Conversation
	err := u.call(ctx, http.MethodPost, "/v1/conversations", req, &c)
	return c, err
}

// Conversation reads a conversation.
func (u *User) Conversation(ctx context.Context, id string) (wire.Conversation, error) {
	var c wire.Conversation
	err := u.call(ctx, http.MethodGet, "/v1/conversations/"+url.PathEscape(id), nil, &c)
	return c, err
}

// Send enqueues a turn.
func (u *User) Send(ctx context.Context, conversationID, prompt string) (wire.Job, error) {
	var j wire.Job
	err := u.call(ctx, http.MethodPost, "/v1/conversations/"+url.PathEscape(conversationID)+"/messages",
		wire.SendMessageRequest{Prompt: prompt}, &j)
	return j, err
}

// Job reads a job with its attempts and events.
func (u *User) Job(ctx context.Context, id string) (wire.Job, error) {
	var j wire.Job
	err := u.call(ctx, http.MethodGet, "/v1/jobs/"+url.PathEscape(id), nil, &j)
	return j, err
}

// Cancel asks for a job to be cancelled.
func (u *User) Cancel(ctx context.Context, id string) (wire.Job, error) {
	var j wire.Job
	err := u.call(ctx, http.MethodPost, "/v1/jobs/"+url.PathEscape(id)+"/cancel", nil, &j)
	return j, err
}

// Permit answers a pending ACP permission request of a running job with
// one of its options.
func (u *User) Permit(ctx context.Context, jobID, requestID, optionID string) (wire.Job, error) {
	var j wire.Job
	err := u.call(ctx, http.MethodPost, PermitPath(jobID, requestID), wire.PermissionAnswer{OptionID: optionID}, &j)
	return j, err
}

// PermitPath is the path of POST /v1/jobs/{job}/permissions/{request}.
func PermitPath(jobID, requestID string) string {
	return "/v1/jobs/" + url.PathEscape(jobID) + "/permissions/" + url.PathEscape(requestID)
}

// Servers is Admin → Servers as JSON.
func (u *User) Servers(ctx context.Context) ([]wire.Server, error) {
	var l wire.ServerList
	err := u.call(ctx, http.MethodGet, "/v1/admin/servers", nil, &l)
	return l.Servers, err
}

// Server returns the named host from Admin → Servers.
func (u *User) Server(ctx context.Context, name string) (wire.Server, bool, error) {
	list, err := u.Servers(ctx)
	if err != nil {
		return wire.Server{}, false, err
	}
	for _, s := range list {
		if s.Name == name {
			return s, true, nil
		}
	}
	return wire.Server{}, false, nil
}

// Ended reports whether a job state is terminal.
func Ended(state string) bool {
	return state == wire.JobSucceeded || state == wire.JobFailed || state == wire.JobCancelled
}

// Poll calls check every tick until it reports done, returns an error, or
// ctx ends; the last error of the user API is kept for the message.
func Poll(ctx context.Context, tick time.Duration, what string, check func(context.Context) (bool, error)) error {
	t := time.NewTicker(tick)
	defer t.Stop()
	var last error
	for {
		done, err := check(ctx)
		if err == nil && done {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("waiting for %s: %w (last error: %v)", what, ctx.Err(), last)
			}
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-t.C:
		}
	}
}

// WaitJob polls a job until cond holds, and returns it.
func (u *User) WaitJob(ctx context.Context, id string, tick time.Duration, what string, cond func(wire.Job) bool) (wire.Job, error) {
	var j wire.Job
	err := Poll(ctx, tick, "job "+id+" "+what, func(ctx context.Context) (bool, error) {
		var err error
		j, err = u.Job(ctx, id)
		return err == nil && cond(j), err
	})
	return j, err
}

// WaitEnded polls a job until it has ended.
func (u *User) WaitEnded(ctx context.Context, id string, tick time.Duration) (wire.Job, error) {
	return u.WaitJob(ctx, id, tick, "to end", func(j wire.Job) bool { return Ended(j.State) })
}

// Delete deletes a conversation (S3).
func (u *User) Delete(ctx context.Context, id string) (wire.Conversation, error) {
	var c wire.Conversation
	err := u.call(ctx, http.MethodDelete, "/v1/conversations/"+url.PathEscape(id), nil, &c)
	return c, err
}
