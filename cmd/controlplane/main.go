// Command controlplane is runnerd's reference control plane:
//
//	controlplane serve      run the HTTP server and the reaper (SQLite by default)
//	controlplane host add   register a sandbox host and print its token once
//	controlplane token …    create, list or revoke user tokens (any replica accepts them)
//	controlplane host list|pause|resume|rotate-token|remove
//	controlplane registration-token create|list|revoke
//	                        the hosts' lifecycle, through the admin API
//	controlplane submit     send a message to a conversation and follow the turn
//	controlplane conversation delete ID
//	                        delete a conversation; its host removes the sandbox
//	controlplane conversation lose ID --reason WHY
//	                        mark a conversation LOST (its host is gone for good)
//	controlplane audit list the admin audit, through the admin API
//
// docs/protocol.md describes the API it serves. Every flag has an
// environment variable, CONTROLPLANE_ and the flag's name (--lease-ttl:
// CONTROLPLANE_LEASE_TTL), and may be set in a --config file (one "flag
// value" per line); a flag beats the variable, which beats the file, which
// beats the default (github.com/peterbourgon/ff reads all three). The prefix is not runnerd's RUNNERD_: the same names there mean
// the daemon's settings (RUNNERD_LEASE_TTL is the lease a runner asks for),
// and one environment may serve both programs (the demo, a dev shell).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"

	"github.com/peterbourgon/ff/v3"

	"github.com/runnerd/runnerd/internal/tlsfiles"
	"github.com/runnerd/runnerd/wire"
)

// version is set by the Makefile (-X main.version=…).
var version = "dev"

// Exit codes.
const (
	exitOK    = 0
	exitFail  = 1 // the work failed: a failed turn, an unreachable server
	exitUsage = 2 // bad flags or arguments
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// usageError is a mistake in the command line: one line, exit 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// oneArg parses flags with one positional argument, which may come before
// or after the flags; what names it in the usage error ("the host's NAME").
func oneArg(f *flags, args []string, what string) (string, error) {
	if err := f.parse(args); err != nil {
		return "", err
	}
	rest := f.fs.Args()
	if len(rest) == 0 {
		return "", usagef("missing %s", what)
	}
	arg := rest[0]
	if err := f.parse(rest[1:]); err != nil {
		return "", err
	}
	if f.fs.NArg() > 0 {
		return "", usagef("unexpected argument %q", f.fs.Arg(0))
	}
	return arg, nil
}

const topUsage = `usage: controlplane <command> [flags]

commands:
  serve      run the control plane (HTTP API, admin page, reaper)
  host add   register a sandbox host; prints its token once (database access)
  host list|pause|resume|rotate-token|remove
  registration-token create|list|revoke
            tokens daemons register themselves with (database access)
             the hosts' lifecycle through the admin API (user token)
  token      create, list or revoke user tokens (kept hashed in the database)
  jobs list|show|cancel|events
             the jobs through the user API (user token; --output json|table)
  submit     send a message to a conversation and follow the turn
  permit     answer an ACP agent's pending permission request: JOB REQUEST OPTION
  conversation delete ID
             delete a conversation (no turn of it may run or wait);
             its host removes the sandbox (user token)
  conversation lose ID --reason WHY
             mark a conversation LOST: the host holding its sandbox is
             gone for good (user token; the audit records the reason)
  audit list who did what to which host, conversation or token, and why
             (user token; --output json|table)
  version    print the version

Run "controlplane <command> -h" for a command's flags.
`

// run is main without the process: it returns the exit code.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, topUsage)
		return exitUsage
	}
	var err error
	name := args[0]
	switch name {
	case "serve":
		err = serve(ctx, args[1:], getenv, stderr)
	case "host":
		switch {
		case len(args) >= 2 && args[1] == "add":
			name = "host add"
			err = hostAdd(ctx, args[2:], getenv, stdout, stderr)
		case len(args) >= 2 && hostCommands[args[1]] != "":
			name = "host " + args[1]
			err = hostAdmin(ctx, args[1], args[2:], getenv, stdout, stderr)
		default:
			err = usagef(`"host" takes a subcommand: add, list, pause, resume, rotate-token or remove`)
		}
	case "token":
		if len(args) > 1 {
			name = "token " + args[1]
		}
		err = token(ctx, args[1:], getenv, stdout, stderr)
	case "registration-token":
		if len(args) > 1 {
			name = "registration-token " + args[1]
		}
		err = registrationToken(ctx, args[1:], getenv, stdout, stderr)
	case "jobs":
		if len(args) < 2 || jobCommands[args[1]] == "" {
			err = usagef(`"jobs" takes a subcommand: list, show, cancel or events`)
			break
		}
		name = "jobs " + args[1]
		err = jobs(ctx, args[1], args[2:], getenv, stdout, stderr)
	case "submit":
		err = submit(ctx, args[1:], getenv, stdout, stderr)
	case "permit":
		err = permit(ctx, args[1:], getenv, stdout, stderr)
	case "conversation":
		name = "conversation"
		if len(args) > 1 {
			name += " " + args[1]
		}
		err = conversation(ctx, args[1:], getenv, stdout, stderr)
	case "audit":
		if len(args) < 2 || args[1] != "list" {
			err = usagef(`"audit" takes a subcommand: list`)
			break
		}
		name = "audit list"
		err = auditList(ctx, args[2:], getenv, stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, version)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, topUsage)
	default:
		err = usagef("unknown command %q (try serve, host add, token, jobs, submit, permit, conversation delete, audit list)", name)
	}
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "controlplane %s: %s\n", name, ue.msg)
		return exitUsage
	case errors.Is(err, errTurnFailed):
		return exitFail // submit already said how the turn ended
	default:
		fmt.Fprintf(stderr, "controlplane %s: %v%s\n", name, err, serverSays(err))
		return exitFail
	}
}

// serverSays is the control plane's own sentence about a refusal (its
// error body's message), for the person at the terminal: the code alone
// does not say which field was wrong.
func serverSays(err error) string {
	var se *wire.StatusError
	if errors.As(err, &se) && se.Message != "" {
		return ": " + se.Message
	}
	return ""
}

// flags is a flag set whose every flag may also come from its variable
// (CONTROLPLANE_ and the flag's name) or from a --config file: one
// definition, three sources, read by ff.
type flags struct {
	fs    *flag.FlagSet
	argv  map[string]bool // flags set on the command line itself
	usage func()
}

func newFlags(cmd string, out io.Writer) *flags {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported in one line by run
	fs.String("config", "", "file of settings, one \"flag value\" per line (# starts a comment); flags and variables win over it")
	f := &flags{fs: fs, argv: map[string]bool{}}
	fs.Usage = func() {} // parse prints it for -h only
	f.usage = func() {
		fmt.Fprintf(out, "usage: controlplane %s [flags]\nEvery flag also has a variable: --lease-ttl is %sLEASE_TTL.\n\n", cmd, envPrefix)
		fs.SetOutput(out)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	return f
}

// envPrefix starts every variable this command reads.
const envPrefix = "CONTROLPLANE_"

// envUserToken may hold the user token itself, for submit.
const envUserToken = envPrefix + "USER_TOKEN"

// onCommandLine reports whether the command line itself set the flag.
func (f *flags) onCommandLine(name string) bool { return f.argv[name] }

// ffEnvError is ff's error for a variable that is not a valid value of
// its flag; it names both but not the value.
var ffEnvError = regexp.MustCompile(`setting flag "([^"]+)" from environment variable "([^"]+)"`)

// parse applies the command line, then the variables, then the --config
// file, each to the flags the ones before left alone.
func (f *flags) parse(args []string) error {
	// The command line alone first, to know what it set (onCommandLine).
	if err := f.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			f.usage()
			return err
		}
		return usagef("%v", err)
	}
	f.fs.Visit(func(fl *flag.Flag) { f.argv[fl.Name] = true })
	err := ff.Parse(f.fs, args, ff.WithEnvVarPrefix(strings.TrimSuffix(envPrefix, "_")),
		ff.WithConfigFileFlag("config"), ff.WithConfigFileParser(ff.PlainParser))
	if err == nil {
		return nil
	}
	if m := ffEnvError.FindStringSubmatch(err.Error()); m != nil {
		return usagef("%s=%q is not a valid --%s", m[2], os.Getenv(m[2]), m[1])
	}
	return usagef("%s", strings.TrimPrefix(err.Error(), "error parsing commandline arguments: "))
}

// clientTransport carries a command's calls to --server: Go's default
// transport, trusting caFile's CA beside the system's when it is given.
// A file that cannot be used is a usage error naming --ca-file.
func clientTransport(caFile string) (http.RoundTripper, error) {
	cfg, err := tlsfiles.Client{CAFile: caFile}.Config()
	if err != nil {
		return nil, usagef("%v", err)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = cfg
	return tr, nil
}
