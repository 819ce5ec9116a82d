// Command cmd measures the cost per held turn (package held):
//
//	go run ./internal/bench/held/cmd -turns 1000
//
// It builds the binaries into a temporary directory unless -bin names
// built ones, prints the table, and exits 1 if the run failed or left
// something behind.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/runnerd/runnerd/internal/bench/held"
	"github.com/runnerd/runnerd/internal/fleet"
)

func main() {
	var cfg held.Config
	var env, jsonOut string
	flag.StringVar(&cfg.Bin, "bin", "", "directory of the built runnerd, controlplane and demoagent (default: build them)")
	flag.IntVar(&cfg.Turns, "turns", 100, "silent turns to hold at once")
	flag.DurationVar(&cfg.Window, "window", time.Minute, "how long CPU is counted while every turn is held")
	flag.DurationVar(&cfg.RenewInterval, "renew-interval", 0, "the daemon's --renew-interval (default the product's)")
	flag.StringVar(&cfg.Dir, "dir", "", "work directory (default a temporary one)")
	flag.BoolVar(&cfg.Keep, "keep", false, "keep the work directory")
	flag.StringVar(&env, "daemon-env", "", "comma-separated KEY=VALUE added to the daemon's environment")
	flag.StringVar(&jsonOut, "json", "", "also write the result as JSON to this file")
	flag.Parse()
	if env != "" {
		cfg.DaemonEnv = strings.Split(env, ",")
	}
	cfg.Progress = os.Stderr

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if cfg.Bin == "" {
		dir, err := os.MkdirTemp("", "runnerd-held-bin-")
		if err != nil {
			fail(err)
		}
		defer os.RemoveAll(dir)
		if _, err := fleet.Build(ctx, ".", dir); err != nil {
			fail(err)
		}
		cfg.Bin = dir
	}
	res, err := held.Run(ctx, cfg)
	if err != nil {
		fail(err)
	}
	res.WriteTable(os.Stdout)
	if jsonOut != "" {
		b, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(jsonOut, append(b, '\n'), 0o644); err != nil {
			fail(err)
		}
	}
	if len(res.Leaks) > 0 {
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "held:", err)
	os.Exit(1)
}
