package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// hostAdd registers a host and hands out its token once (handOut). Only
// the token's hash is stored.
func hostAdd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f := newFlags("host add NAME", stderr)
	d := addDBFlags(f)
	tokenFile := addTokenFileFlag(f)
	reason := f.fs.String("reason", "", "why (recorded in the audit with your OS user's name)")
	name, st, err := dbCommand(ctx, f, d, args, "the host's NAME", checkHostName)
	if err != nil {
		return err
	}
	defer st.Close()
	if len(*reason) > wire.MaxAuditReason {
		return usagef("--reason is at most %d bytes", wire.MaxAuditReason)
	}
	token := controlplane.NewToken(controlplane.HostTokenPrefix)
	return handOut(token, *tokenFile, stdout, stderr, func() (string, error) {
		_, err := st.CreateHost(ctx, name, controlplane.HashToken(token), cliAudit(*reason), time.Now())
		if errors.Is(err, store.ErrExists) {
			err = fmt.Errorf("a host named %q already exists", name)
		}
		return "host " + name + " added", err
	})
}

// checkHostName allows what a host name or a systemd instance name holds.
func checkHostName(name string) error {
	if len(name) > 128 {
		return usagef("the host name is longer than 128 characters")
	}
	for _, r := range name {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_'
		if !ok {
			return usagef("the host name %q may hold only letters, digits, '.', '-' and '_'", name)
		}
	}
	return nil
}
