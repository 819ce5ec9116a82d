package main

import (
	"context"
	"errors"
	"fmt"
	"io"
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

// tokenCreate makes a user token and hands it out once (handOut). Only
// its hash is stored.
func tokenCreate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f := newFlags("token create NAME", stderr)
	d := addDBFlags(f)
	tokenFile := addTokenFileFlag(f)
	name, st, err := dbCommand(ctx, f, d, args, "the token's NAME (a label: who or what holds it)", checkLabelName)
	if err != nil {
		return err
	}
	defer st.Close()
	tok := controlplane.NewToken(controlplane.UserTokenPrefix)
	return handOut(tok, *tokenFile, stdout, stderr, func() (string, error) {
		t, err := st.CreateUserToken(ctx, name, controlplane.HashToken(tok), cliAudit(""), time.Now())
		return fmt.Sprintf("user token %s (%s) created", t.ID, name), err
	})
}

// tokenList prints every user token's id, name, creation and revocation;
// never a token, never a hash.
func tokenList(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f := newFlags("token list", stderr)
	_, st, err := dbCommand(ctx, f, addDBFlags(f), args, "", nil)
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
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", t.ID, t.Name, t.CreatedAt.UTC().Format(time.RFC3339), stamp(t.RevokedAt, "-"))
	}
	return w.Flush()
}

// tokenRevoke refuses a user token from now on, on every replica (they
// look it up on each request).
func tokenRevoke(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f := newFlags("token revoke ID", stderr)
	id, st, err := dbCommand(ctx, f, addDBFlags(f), args, "the token's ID (from controlplane token list)", nil)
	if err != nil {
		return err
	}
	defer st.Close()
	t, err := st.RevokeUserToken(ctx, id, cliAudit(""), time.Now())
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("no user token has the id %q (see controlplane token list)", id)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "user token %s (%s) revoked at %s\n", t.ID, t.Name, t.RevokedAt.UTC().Format(time.RFC3339))
	return nil
}

// stamp is a list's time, none when there is none.
func stamp(t *time.Time, none string) string {
	if t == nil {
		return none
	}
	return t.UTC().Format(time.RFC3339)
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
