package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
)

// hostAdd registers a host and hands out its token once: on stdout, or
// into a new 0600 file with --token-file. Only the token's hash is stored.
func hostAdd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f := newFlags("host add NAME", stderr)
	d := addDBFlags(f)
	tokenFile := f.fs.String("token-file", "", "write the host token to this new file (0600) instead of printing it")
	name, err := oneArg(f, args, "the host's NAME")
	if err != nil {
		return err
	}
	if err := checkHostName(name); err != nil {
		return err
	}
	if err := d.check(); err != nil {
		return err
	}
	st, _, err := d.open(ctx)
	if err != nil {
		return err
	}
	defer st.Close()

	token := controlplane.NewToken(controlplane.HostTokenPrefix)
	if *tokenFile != "" {
		// Written before the host exists, so a token that could not be
		// kept never works; removed again if the host cannot be added.
		if err := writeSecret(*tokenFile, token+"\n"); err != nil {
			return fmt.Errorf("write the token file: %w", err)
		}
	}
	if _, err := st.CreateHost(ctx, name, controlplane.HashToken(token), time.Now()); err != nil {
		if *tokenFile != "" {
			_ = os.Remove(*tokenFile)
		}
		if errors.Is(err, store.ErrExists) {
			return fmt.Errorf("a host named %q already exists", name)
		}
		return err
	}
	if *tokenFile != "" {
		fmt.Fprintf(stderr, "host %s added; its token is in %s (only its hash is stored)\n", name, *tokenFile)
		return nil
	}
	fmt.Fprintln(stdout, token)
	fmt.Fprintf(stderr, "host %s added; its token above is shown once (only its hash is stored)\n", name)
	return nil
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
