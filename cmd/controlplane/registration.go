package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// registrationToken runs `controlplane registration-token
// create|list|revoke`: the tokens daemons register themselves with
// (runnerd run --registration-token-file), kept hashed in the database.
func registrationToken(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	const subs = `"registration-token" takes the subcommand "create", "list" or "revoke"`
	if len(args) == 0 {
		return usagef("%s", subs)
	}
	switch args[0] {
	case "create":
		return registrationTokenCreate(ctx, args[1:], stdout, stderr)
	case "list":
		return registrationTokenList(ctx, args[1:], stdout, stderr)
	case "revoke":
		return registrationTokenRevoke(ctx, args[1:], stderr)
	}
	return usagef("%s, not %q", subs, args[0])
}

// labelList is --label name=value, repeatable.
type labelList wire.Labels

func (l labelList) String() string { return wire.Labels(l).String() }
func (l labelList) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok {
		return fmt.Errorf("want name=value, not %q", v)
	}
	if had, dup := l[k]; dup && had != val {
		return fmt.Errorf("label %q given twice", k)
	}
	l[k] = val
	return nil
}

// registrationTokenCreate makes a registration token and hands it out
// once (handOut).
func registrationTokenCreate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newFlags("registration-token create NAME", stderr)
	d := addDBFlags(f)
	tokenFile := addTokenFileFlag(f)
	expires := f.fs.Duration("expires", 0, "the token is refused this long after its creation (0: never)")
	maxUses := f.fs.Int("max-uses", 0, "how many hosts the token may register (0: no limit)")
	labels := labelList{}
	f.fs.Var(labels, "label", "name=value: an operator label a host registering with this token may carry (repeat); none given grants none")
	name, st, err := dbCommand(ctx, f, d, args, "the token's NAME (a label: which fleet or image holds it)", checkLabelName)
	if err != nil {
		return err
	}
	defer st.Close()
	switch {
	case *expires < 0:
		return usagef("--expires must not be negative")
	case *maxUses < 0:
		return usagef("--max-uses must not be negative")
	}
	if err := wire.Labels(labels).Check(); err != nil {
		return usagef("--label: %v", err)
	}
	for _, k := range []string{wire.LabelSandbox, wire.LabelOS, wire.LabelArch} {
		if _, ok := labels[k]; ok {
			return usagef("--label: %q is an automatic label, set by each daemon itself", k)
		}
	}
	now, err := st.Now(ctx)
	if err != nil {
		return err
	}
	t := store.RegistrationToken{Name: name, Labels: wire.Labels(labels), MaxUses: *maxUses}
	if *expires > 0 {
		at := now.Add(*expires)
		t.ExpiresAt = &at
	}
	tok := controlplane.NewToken(controlplane.RegistrationTokenPrefix)
	return handOut(tok, *tokenFile, stdout, stderr, func() (string, error) {
		t, err := st.CreateRegistrationToken(ctx, t, controlplane.HashToken(tok), cliAudit(""), now)
		return fmt.Sprintf("registration token %s (%s) created", t.ID, name), err
	})
}

// registrationTokenList prints every registration token's id, name,
// grants and state; never a token, never a hash.
func registrationTokenList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newFlags("registration-token list", stderr)
	_, st, err := dbCommand(ctx, f, addDBFlags(f), args, "", nil)
	if err != nil {
		return err
	}
	defer st.Close()
	ts, err := st.ListRegistrationTokens(ctx)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tNAME\tLABELS\tUSES\tEXPIRES\tCREATED\tREVOKED")
	for _, t := range ts {
		uses := fmt.Sprintf("%d/%d", t.Uses, t.MaxUses)
		if t.MaxUses == 0 {
			uses = fmt.Sprintf("%d/-", t.Uses)
		}
		labels := t.Labels.String()
		if labels == "" {
			labels = "-"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.Name, labels, uses, stamp(t.ExpiresAt, "never"),
			t.CreatedAt.UTC().Format(time.RFC3339), stamp(t.RevokedAt, "-"))
	}
	return w.Flush()
}

// registrationTokenRevoke refuses a registration token from now on; the
// hosts it registered keep their own tokens.
func registrationTokenRevoke(ctx context.Context, args []string, stderr io.Writer) error {
	f := newFlags("registration-token revoke ID", stderr)
	id, st, err := dbCommand(ctx, f, addDBFlags(f), args, "the token's ID (from controlplane registration-token list)", nil)
	if err != nil {
		return err
	}
	defer st.Close()
	now, err := st.Now(ctx)
	if err != nil {
		return err
	}
	t, err := st.RevokeRegistrationToken(ctx, id, cliAudit(""), now)
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("no registration token has the id %q (see controlplane registration-token list)", id)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "registration token %s (%s) revoked at %s; the hosts it registered keep their own tokens\n", t.ID, t.Name, t.RevokedAt.UTC().Format(time.RFC3339))
	return nil
}
