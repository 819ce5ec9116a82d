package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/user"
	"strconv"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore"
)

// The commands that issue, list and revoke secrets against the database
// (token, registration-token, host add) share one shape: parse the flags
// with at most one argument, open the existing store, act with the OS
// user as the audit's actor, hand a new secret out once. This file is
// that shape.

// dbCommand parses a database command's flags and its one argument (what
// names it in the usage error; "" for a command that takes none), checks
// the argument with check (when not nil) and the database flags, and only
// then opens the existing store, which the caller closes.
func dbCommand(ctx context.Context, f *flags, d *dbFlags, args []string, what string, check func(string) error) (string, *sqlstore.Store, error) {
	var arg string
	if what == "" {
		if err := f.parse(args); err != nil {
			return "", nil, err
		}
		if f.fs.NArg() > 0 {
			return "", nil, usagef("unexpected argument %q", f.fs.Arg(0))
		}
	} else {
		var err error
		if arg, err = oneArg(f, args, what); err != nil {
			return "", nil, err
		}
		if err := checkText(arg); err != nil {
			return "", nil, err
		}
		if check != nil {
			if err := check(arg); err != nil {
				return "", nil, err
			}
		}
	}
	if err := d.check(); err != nil {
		return "", nil, err
	}
	st, _, err := d.open(ctx)
	if err != nil {
		return "", nil, err
	}
	return arg, st, nil
}

// cliAudit is the audit of a command run against the database: the actor
// is "cli:" and the OS user's login name, looked up by the process's uid
// (os/user), so that an unset or forged $USER changes nothing; a uid with
// no name is "cli:uid:N".
func cliAudit(reason string) store.Audit {
	name := "uid:" + strconv.Itoa(os.Getuid())
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	return store.Audit{Actor: "cli:" + name, Reason: reason}
}

// handOut hands the new secret out once. With tokenFile it is written to
// that new file (0600) before keep stores its hash, so that a secret that
// could not be kept never works, and the file is removed again if keep
// fails; without, it is printed on stdout once keep succeeded. keep
// returns the sentence that says what was made ("user token utok_… (ci)
// created"), to which stderr's line adds where the secret is.
func handOut(secret, tokenFile string, stdout, stderr io.Writer, keep func() (string, error)) error {
	if tokenFile != "" {
		if err := writeSecret(tokenFile, secret+"\n"); err != nil {
			return fmt.Errorf("write the token file: %w", err)
		}
	}
	said, err := keep()
	if err != nil {
		if tokenFile != "" {
			_ = os.Remove(tokenFile)
		}
		return err
	}
	if tokenFile != "" {
		fmt.Fprintf(stderr, "%s; the token is in %s (only its hash is stored)\n", said, tokenFile)
		return nil
	}
	fmt.Fprintln(stdout, secret)
	fmt.Fprintf(stderr, "%s; the token above is shown once (only its hash is stored)\n", said)
	return nil
}

// addTokenFileFlag is --token-file of the commands that hand a secret out.
func addTokenFileFlag(f *flags) *string {
	return f.fs.String("token-file", "", "write the token to this new file (0600) instead of printing it")
}

// checkLabelName checks a token's NAME, a label: who or what holds it.
func checkLabelName(name string) error {
	if len(name) > 128 {
		return usagef("the token's name is longer than 128 characters")
	}
	return nil
}
