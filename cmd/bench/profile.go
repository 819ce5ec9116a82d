package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/pprof"
	"time"
)

// Frames that make a CPU sample the benchmark's own clients', not the
// control plane's; and the control plane's token checks (host and worker
// tokens looked up apart from the call's statement: Server.host, whose
// host-token cache is part of it, and Server.attempt).
const (
	clientFrames = `wire\.\(\*Client\)|net/http\.\(\*persistConn\)|net/http\.\(\*Transport\)|cmd/bench`
	tokenFrames  = `controlplane\.\(\*Server\)\.(host|attempt)$`
)

// profiled runs f under a CPU profile and returns the share of the control
// plane's CPU (samples outside the clients) spent in its token lookups, by
// `go tool pprof` over the profile; "" when that cannot be read, with why.
// The profile is kept at keep unless that is empty.
func profiled(ctx context.Context, keep string, f func() error) (share float64, why string, err error) {
	path := keep
	if path == "" {
		dir, err := os.MkdirTemp("", "runnerd-bench-prof-")
		if err != nil {
			return 0, "", err
		}
		defer os.RemoveAll(dir)
		path = filepath.Join(dir, "cpu.pprof")
	}
	out, err := os.Create(path)
	if err != nil {
		return 0, "", err
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		out.Close()
		return 0, "", err
	}
	err = f()
	pprof.StopCPUProfile()
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, "", err
	}
	server, err := pprofTotal(ctx, path, "-ignore="+clientFrames)
	if err != nil {
		return 0, err.Error(), nil
	}
	tokens, err := pprofTotal(ctx, path, "-ignore="+clientFrames, "-focus="+tokenFrames)
	if err != nil {
		return 0, err.Error(), nil
	}
	if server <= 0 {
		return 0, "no control-plane samples in the profile", nil
	}
	return float64(tokens) / float64(server), "", nil
}

var accounting = regexp.MustCompile(`Showing nodes accounting for (\S+), `)

// pprofTotal is the CPU time of the profile's samples that filters keep.
func pprofTotal(ctx context.Context, path string, filters ...string) (time.Duration, error) {
	args := append([]string{"tool", "pprof", "-top", "-nodecount=1000000"}, filters...)
	out, err := exec.CommandContext(ctx, "go", append(args, path)...).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("go tool pprof: %v: %s", err, firstLine(string(out)))
	}
	m := accounting.FindSubmatch(out)
	if m == nil {
		// No sample passed the filters: pprof says so without a total.
		return 0, nil
	}
	return time.ParseDuration(string(m[1]))
}
