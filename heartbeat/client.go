package heartbeat

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/url"
	"time"
)

// HTTPConfig configures the renewal HTTP client. Zero fields mean the default.
type HTTPConfig struct {
	// RequestTimeout is the overall limit of one request, pool wait, dial,
	// write and read included (R3). Default 10 s.
	RequestTimeout time.Duration
	// DialTimeout limits connecting. Default 5 s.
	DialTimeout time.Duration
	// TLSHandshakeTimeout limits the TLS handshake. Default 5 s.
	TLSHandshakeTimeout time.Duration
	// WriteTimeout limits each write to the connection. Default 5 s.
	WriteTimeout time.Duration
	// ResponseHeaderTimeout limits the wait for the answer's header after the
	// request was written. Default: RequestTimeout.
	ResponseHeaderTimeout time.Duration
	// MaxConnsPerHost bounds the pool. A request waiting for a pooled
	// connection waits at most until its own overall limit. Default 32.
	MaxConnsPerHost int
	// IdleConnTimeout drops a connection idle this long. Default 90 s.
	IdleConnTimeout time.Duration
	// TLSClientConfig for https control planes; nil means Go's defaults.
	TLSClientConfig *tls.Config
	// Proxy picks a proxy per request (cmd/ may pass http.ProxyFromEnvironment);
	// nil means none.
	Proxy func(*http.Request) (*url.URL, error)
	// DialContext dials; nil means a net.Dialer. Tests pass memnet's Dial.
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
}

// NewHTTPClient returns the renewal client: its own transport and pool,
// never shared with event uploads or receipts, so a busy turn cannot starve
// renewals. Connect, TLS handshake, each write and the response header have
// their own limits, and the whole request has RequestTimeout. The Renewer
// closes its idle connections after consecutive failures, so one stuck
// connection cannot hold renewals hostage (Kubernetes issue 48638); on
// HTTP/2 a ping health check closes a silent connection as well.
func NewHTTPClient(cfg HTTPConfig) *http.Client {
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.TLSHandshakeTimeout <= 0 {
		cfg.TLSHandshakeTimeout = 5 * time.Second
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 5 * time.Second
	}
	if cfg.ResponseHeaderTimeout <= 0 {
		cfg.ResponseHeaderTimeout = cfg.RequestTimeout
	}
	if cfg.MaxConnsPerHost <= 0 {
		cfg.MaxConnsPerHost = 32
	}
	if cfg.IdleConnTimeout <= 0 {
		cfg.IdleConnTimeout = 90 * time.Second
	}
	dial := cfg.DialContext
	if dial == nil {
		dial = (&net.Dialer{KeepAlive: 15 * time.Second}).DialContext
	}
	dialTimeout, writeTimeout := cfg.DialTimeout, cfg.WriteTimeout
	tr := &http.Transport{
		Proxy: cfg.Proxy,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			ctx, cancel := context.WithTimeout(ctx, dialTimeout)
			defer cancel()
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &writeLimitConn{Conn: c, limit: writeTimeout}, nil
		},
		TLSClientConfig:       cfg.TLSClientConfig,
		TLSHandshakeTimeout:   cfg.TLSHandshakeTimeout,
		ResponseHeaderTimeout: cfg.ResponseHeaderTimeout,
		MaxConnsPerHost:       cfg.MaxConnsPerHost,
		MaxIdleConnsPerHost:   cfg.MaxConnsPerHost,
		MaxIdleConns:          cfg.MaxConnsPerHost,
		IdleConnTimeout:       cfg.IdleConnTimeout,
		ForceAttemptHTTP2:     true,
		HTTP2: &http.HTTP2Config{
			SendPingTimeout:  cfg.RequestTimeout,
			PingTimeout:      cfg.RequestTimeout / 2,
			WriteByteTimeout: cfg.WriteTimeout,
		},
	}
	return &http.Client{Transport: tr, Timeout: cfg.RequestTimeout}
}

// writeLimitConn bounds each write: the transport itself has no write limit,
// and a peer that stops reading would otherwise hold a request until its
// overall limit.
type writeLimitConn struct {
	net.Conn
	limit time.Duration
}

func (c *writeLimitConn) Write(p []byte) (int, error) {
	if err := c.Conn.SetWriteDeadline(time.Now().Add(c.limit)); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}
