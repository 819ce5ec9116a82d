package heartbeat

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"time"
)

// HTTPConfig configures the renewal HTTP client. Zero fields mean the default.
type HTTPConfig struct {
	// RequestTimeout is the overall limit of one request, pool wait, dial,
	// write and read included (R3). Default 10 s.
	RequestTimeout time.Duration
	// PoolTimeout limits the wait for a connection when the pool is full
	// (MaxConnsPerHost in use): from asking for a connection until one is
	// handed over or a dial for it begins. Default 5 s.
	PoolTimeout time.Duration
	// DialTimeout limits connecting. Default 5 s.
	DialTimeout time.Duration
	// TLSHandshakeTimeout limits the TLS handshake. Default 5 s.
	TLSHandshakeTimeout time.Duration
	// WriteTimeout limits each write to the connection. Default 5 s.
	WriteTimeout time.Duration
	// ReadTimeout limits each wait for the answer: for its first byte
	// after the request was written, then for each further piece of it.
	// An answer that keeps trickling in is ended by RequestTimeout.
	// Default 10 s, so that R14's cadence (a read timing out after 10 s,
	// the retry 5 s later) holds at the defaults.
	ReadTimeout time.Duration
	// MaxConnsPerHost bounds the pool. Default 32.
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
// renewals. Pool wait, connect, TLS handshake, each write and each read
// have their own limits, and the whole request has RequestTimeout (R3). The Renewer
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
	if cfg.PoolTimeout <= 0 {
		cfg.PoolTimeout = 5 * time.Second
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = DefaultRequestTimeout
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
			// A dial begins: the request no longer waits for the pool. (A
			// net.Dialer says so itself; any other dial does not.)
			if tr := httptrace.ContextClientTrace(ctx); tr != nil && tr.ConnectStart != nil {
				tr.ConnectStart(network, addr)
			}
			ctx, cancel := context.WithTimeout(ctx, dialTimeout)
			defer cancel()
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &writeLimitConn{Conn: c, limit: writeTimeout}, nil
		},
		TLSClientConfig:     cfg.TLSClientConfig,
		TLSHandshakeTimeout: cfg.TLSHandshakeTimeout,
		MaxConnsPerHost:     cfg.MaxConnsPerHost,
		MaxIdleConnsPerHost: cfg.MaxConnsPerHost,
		MaxIdleConns:        cfg.MaxConnsPerHost,
		IdleConnTimeout:     cfg.IdleConnTimeout,
		ForceAttemptHTTP2:   true,
		HTTP2: &http.HTTP2Config{
			SendPingTimeout:  cfg.RequestTimeout,
			PingTimeout:      cfg.RequestTimeout / 2,
			WriteByteTimeout: cfg.WriteTimeout,
		},
	}
	return &http.Client{Transport: &phaseLimits{base: tr, pool: cfg.PoolTimeout, read: cfg.ReadTimeout}, Timeout: cfg.RequestTimeout}
}

// PhaseTimeout is a request that one of its own limits ended: the wait for
// a pooled connection or a read (R3). It is a timeout (net.Error), never a
// cancellation of the caller's.
type PhaseTimeout struct{ Phase string }

func (e *PhaseTimeout) Error() string   { return "renewal " + e.Phase + " timed out" }
func (e *PhaseTimeout) Timeout() bool   { return true }
func (e *PhaseTimeout) Temporary() bool { return true }

// phaseLimits bounds the two phases http.Transport has no limit of its own
// for: the wait for a pooled connection, and each wait for the answer. It
// watches the request through httptrace and cancels it with the phase's
// timeout as the cause.
type phaseLimits struct {
	base *http.Transport
	pool time.Duration
	read time.Duration
}

func (p *phaseLimits) CloseIdleConnections() { p.base.CloseIdleConnections() }

func (p *phaseLimits) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancelCause(req.Context())
	poolTimer := time.AfterFunc(time.Hour, func() { cancel(&PhaseTimeout{Phase: "pool wait"}) })
	poolTimer.Stop()
	readTimer := time.AfterFunc(time.Hour, func() { cancel(&PhaseTimeout{Phase: "read"}) })
	readTimer.Stop()
	trace := &httptrace.ClientTrace{
		GetConn:              func(string) { poolTimer.Reset(p.pool) },
		ConnectStart:         func(string, string) { poolTimer.Stop() },
		GotConn:              func(httptrace.GotConnInfo) { poolTimer.Stop() },
		WroteRequest:         func(httptrace.WroteRequestInfo) { readTimer.Reset(p.read) },
		GotFirstResponseByte: func() { readTimer.Reset(p.read) },
	}
	resp, err := p.base.RoundTrip(req.WithContext(httptrace.WithClientTrace(ctx, trace)))
	if err != nil {
		poolTimer.Stop()
		readTimer.Stop()
		cause := context.Cause(ctx)
		cancel(nil)
		var pt *PhaseTimeout
		if errors.As(cause, &pt) {
			return nil, pt
		}
		return nil, err
	}
	resp.Body = &readLimitBody{ReadCloser: resp.Body, ctx: ctx, cancel: cancel, timer: readTimer, limit: p.read}
	return resp, nil
}

// readLimitBody restarts the read limit with each piece of the answer and
// reports the limit's timeout, not the cancellation it caused.
type readLimitBody struct {
	io.ReadCloser
	ctx    context.Context
	cancel context.CancelCauseFunc
	timer  *time.Timer
	limit  time.Duration
}

func (b *readLimitBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.timer.Reset(b.limit)
	}
	if err != nil && err != io.EOF {
		var pt *PhaseTimeout
		if errors.As(context.Cause(b.ctx), &pt) {
			return n, pt
		}
	}
	return n, err
}

func (b *readLimitBody) Close() error {
	b.timer.Stop()
	err := b.ReadCloser.Close()
	b.cancel(nil)
	return err
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
