package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
)

// token runs `controlplane token create|list|revoke`: the user tokens of
// the user API and the admin pages, kept (hashed) in the database so that
// every replica accepts them.
func token(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usagef(`"token" takes the subcommand "create", "list" or "revoke"`)
	}
	switch args[0] {
	case "create":
		return tokenCreate(ctx, args[1:], getenv, stdout, stderr)
	case "list":
		return tokenList(ctx, args[1:], getenv, stdout, stderr)
	case "revoke":
		return tokenRevoke(ctx, args[1:], getenv, stdout, stderr)
	}
	return usagef(`"token" takes the subcommand "create", "list" or "revoke", not %q`, args[0])
}

// tokenCreate makes a user token and hands it out once: on stdout, or in a
// new 0600 file with --token-file. Only its hash is stored.
func tokenCreate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f := newFlags("token create NAME", stderr)
	d := addDBFlags(f)
	tokenFile := f.fs.String("token-file", "", "write the token to this new file (0600) instead of printing it")
	name, err := oneArg(f, args, "the token's NAME (a label: who or what holds it)")
	if err != nil {
		return err
	}
	if len(name) > 128 {
		return usagef("the token's name is longer than 128 characters")
	}
	if err := checkText(name); err != nil {
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

	tok := controlplane.NewToken(controlplane.UserTokenPrefix)
	if *tokenFile != "" {
		// Written before the token is stored, so that a token that could
		// not be kept never works; removed again if it cannot be stored.
		if err := writeSecret(*tokenFile, tok+"\n"); err != nil {
			return fmt.Errorf("write the token file: %w", err)
		}
	}
	t, err := st.CreateUserToken(ctx, name, controlplane.HashToken(tok), time.Now())
	if err != nil {
		if *tokenFile != "" {
			_ = os.Remove(*tokenFile)
		}
		return err
	}
	if *tokenFile != "" {
		fmt.Fprintf(stderr, "user token %s (%s) created; it is in %s (only its hash is stored)\n", t.ID, name, *tokenFile)
		return nil
	}
	fmt.Fprintln(stdout, tok)
	fmt.Fprintf(stderr, "user token %s (%s) created; it is shown above once (only its hash is stored)\n", t.ID, name)
	return nil
}

// tokenList prints every user token's id, name, creation and revocation;
// never a token, never a hash.
func tokenList(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f := newFlags("token list", stderr)
	d := addDBFlags(f)
	if err := f.parse(args); err != nil {
		return err
	}
	if f.fs.NArg() > 0 {
		return usagef("unexpected argument %q", f.fs.Arg(0))
	}
	if err := d.check(); err != nil {
		return err
	}
	st, _, err := d.open(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	ts, err := st.ListUserTokens(ctx)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tNAME\tCREATED\tREVOKED")
	for _, t := range ts {
		revoked := "-"
		if t.RevokedAt != nil {
			revoked = t.RevokedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", t.ID, t.Name, t.CreatedAt.UTC().Format(time.RFC3339), revoked)
	}
	return w.Flush()
}

// tokenRevoke refuses a user token from now on, on every replica (they
// look it up on each request).
func tokenRevoke(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f := newFlags("token revoke ID", stderr)
	d := addDBFlags(f)
	id, err := oneArg(f, args, "the token's ID (from controlplane token list)")
	if err != nil {
		return err
	}
	if err := checkText(id); err != nil {
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
	t, err := st.RevokeUserToken(ctx, id, time.Now())
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("no user token has the id %q (see controlplane token list)", id)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "user token %s (%s) revoked at %s\n", t.ID, t.Name, t.RevokedAt.UTC().Format(time.RFC3339))
	return nil
}

// checkText refuses an argument no database text can hold.
func checkText(s string) error {
	for _, r := range s {
		if r == 0 || r == '\uFFFD' {
			return usagef("the argument must be UTF-8 text without a NUL character")
		}
	}
	return nil
}
