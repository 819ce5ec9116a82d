package sqltest

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// RoundTrips returns a DSN for sqlstore.OpenPostgres that reaches the
// database named by dsn through connections counting their round trips,
// and the count: the times a connection wrote to the database after it
// had read (or before it read at all) — each a request whose answer the
// client then waited for, however many messages it carried.
func RoundTrips(tb testing.TB, dsn string) (string, *atomic.Int64) {
	tb.Helper()
	name, trips, unregister, err := CountRoundTrips(dsn)
	if err != nil {
		tb.Fatalf("parse the DSN: %v", err)
	}
	tb.Cleanup(unregister)
	return name, trips
}

// CountRoundTrips is RoundTrips outside a test (cmd/bench): unregister
// forgets the DSN it returns.
func CountRoundTrips(dsn string) (name string, trips *atomic.Int64, unregister func(), err error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return "", nil, nil, err
	}
	trips = new(atomic.Int64)
	var d net.Dialer
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &tripConn{Conn: c, trips: trips}, nil
	}
	name = stdlib.RegisterConnConfig(cfg)
	return name, trips, func() { stdlib.UnregisterConnConfig(name) }, nil
}

// tripConn counts round trips on one connection, which pgx uses from one
// goroutine at a time.
type tripConn struct {
	net.Conn
	trips   *atomic.Int64
	writing atomic.Bool // the last thing done was a write
}

func (c *tripConn) Write(b []byte) (int, error) {
	if !c.writing.Swap(true) {
		c.trips.Add(1)
	}
	return c.Conn.Write(b)
}

func (c *tripConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.writing.Store(false)
	}
	return n, err
}
