package controlplane

import (
	"sync"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
)

// HostTokenCache is how long a replica answers for a host token from its
// own memory rather than asking the store: the bound within which a host
// removed, or a token rotated, through another replica is refused here
// too. The replica that made the change forgets every cached host at
// once. Only tokens the store accepted are kept; an unknown token is
// asked about every time. Claims never depend on it: the claim statement
// reads the host's row (a removed or paused host claims nothing).
const HostTokenCache = 2 * time.Second

// maxCachedHosts bounds the cache; past it, the cache starts afresh.
const maxCachedHosts = 4096

// hostCache maps host token hashes to the hosts the store answered, with
// when (on the replica's own clock, Config.Now: it judges nothing the
// store keeps).
type hostCache struct {
	mu sync.Mutex // guards m
	m  map[[32]byte]cachedHost
}

type cachedHost struct {
	host store.Host
	at   time.Time
}

// get returns the cached host of hash if it was stored within HostTokenCache before now.
func (c *hostCache) get(hash []byte, now time.Time) (store.Host, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[[32]byte(hash)]
	if !ok || now.Sub(e.at) >= HostTokenCache || now.Before(e.at) {
		return store.Host{}, false
	}
	return e.host, true
}

func (c *hostCache) put(hash []byte, h store.Host, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxCachedHosts {
		c.m = make(map[[32]byte]cachedHost)
	}
	c.m[[32]byte(hash)] = cachedHost{host: h, at: now}
}

// forget drops every cached host: this replica changed one.
func (c *hostCache) forget() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m = nil
}
