package main

import (
	"net/http"
	"net/url"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// apiFlags are the flags of every command that calls the control plane's
// API with the user token (host list…, jobs, submit, permit, conversation
// delete): where the server is, how to trust it, where the token is.
type apiFlags struct {
	f                                  *flags
	server, dataDir, tokenFile, caFile *string
}

func addAPIFlags(f *flags) *apiFlags {
	return &apiFlags{
		f:         f,
		server:    f.fs.String("server", "http://127.0.0.1:8080", "control plane URL"),
		dataDir:   f.fs.String("data-dir", "data", "data directory of the control plane, for its user token"),
		tokenFile: f.fs.String("user-token-file", "", "file holding the user token (default DATA-DIR/user-token; env CONTROLPLANE_USER_TOKEN holds the token itself)"),
		caFile:    f.fs.String("ca-file", "", "PEM CA to trust beside the system's, for an https:// --server"),
	}
}

// client checks the flags once parsed and returns a client of --server
// whose every call is bounded by timeout, and the user token to send.
func (a *apiFlags) client(getenv func(string) string, timeout time.Duration) (*wire.Client, string, error) {
	u, err := url.Parse(*a.server)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, "", usagef("--server must be an http:// or https:// URL")
	}
	token, err := userToken(a.f, *a.tokenFile, getenv, *a.dataDir)
	if err != nil {
		return nil, "", err
	}
	tr, err := clientTransport(*a.caFile)
	if err != nil {
		return nil, "", err
	}
	return &wire.Client{BaseURL: *a.server, HTTP: &http.Client{Transport: tr, Timeout: timeout}}, token, nil
}
