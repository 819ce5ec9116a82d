//go:build tools

package tools

import (
	_ "github.com/coreos/go-systemd/v22/daemon"
	_ "github.com/docker/docker/client"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "go.uber.org/goleak"
	_ "golang.org/x/sys/unix"
	_ "modernc.org/sqlite"
	_ "pgregory.net/rapid"
)
