package chaos

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math/big"
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// network is the campaign's private network: a bridge in the test's own
// namespace, whose address (gw) is where the test process serves the
// hosts' fault proxies and PostgreSQL, and one network namespace per host
// and per replica, each joined to the bridge by a veth pair. Cutting a
// node off is taking the bridge's end of its pair down: its connections
// stall, its new ones time out, as behind a pulled cable.
type network struct {
	t      *testing.T
	id     string // a few hex digits that tell this run's links apart
	bridge string
	prefix string // "10.X.Y."
	gw     string // prefix + "1"

	mu    sync.Mutex // guards nodes
	nodes []*node
}

// node is one namespace on the bridge.
type node struct {
	name string // h1, r1, …
	ns   string // the namespace's name
	veth string // the bridge's end of its pair
	ip   string
}

// wrap runs a command inside the node's namespace (it execs the command,
// so the pid stays the command's).
func (n *node) wrap() []string { return []string{"ip", "netns", "exec", n.ns} }

func run(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// newNetwork makes the bridge on a /24 of 10.0.0.0/8 that no interface of
// this machine uses; t.Cleanup removes it and every namespace.
func newNetwork(t *testing.T) *network {
	t.Helper()
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	used := map[string]bool{}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
				ip := ipn.IP.To4()
				used[fmt.Sprintf("%d.%d.%d.", ip[0], ip[1], ip[2])] = true
			}
		}
	}
	var prefix string
	for range 100 {
		x, _ := rand.Int(rand.Reader, big.NewInt(50))
		y, _ := rand.Int(rand.Reader, big.NewInt(256))
		p := fmt.Sprintf("10.%d.%d.", 200+x.Int64(), y.Int64())
		if !used[p] {
			prefix = p
			break
		}
	}
	if prefix == "" {
		t.Fatal("no free /24 for the campaign's bridge")
	}
	nw := &network{t: t, id: id, bridge: "chb" + id, prefix: prefix, gw: prefix + "1"}
	t.Cleanup(nw.remove)
	for _, args := range [][]string{
		{"ip", "link", "add", nw.bridge, "type", "bridge"},
		{"ip", "addr", "add", nw.gw + "/24", "dev", nw.bridge},
		{"ip", "link", "set", nw.bridge, "up"},
	} {
		if err := run(args...); err != nil {
			t.Fatal(err)
		}
	}
	return nw
}

// add makes node name's namespace on the bridge at address prefix+octet.
func (nw *network) add(name string, octet int) *node {
	nw.t.Helper()
	n := &node{name: name, ns: "ch" + nw.id + name, veth: "ch" + nw.id + name, ip: fmt.Sprintf("%s%d", nw.prefix, octet)}
	peer := n.veth + "p"
	nw.mu.Lock()
	nw.nodes = append(nw.nodes, n)
	nw.mu.Unlock()
	for _, args := range [][]string{
		{"ip", "netns", "add", n.ns},
		{"ip", "link", "add", n.veth, "type", "veth", "peer", "name", peer},
		{"ip", "link", "set", peer, "netns", n.ns},
		{"ip", "link", "set", n.veth, "master", nw.bridge},
		{"ip", "link", "set", n.veth, "up"},
		{"ip", "-n", n.ns, "addr", "add", n.ip + "/24", "dev", peer},
		{"ip", "-n", n.ns, "link", "set", peer, "up"},
		{"ip", "-n", n.ns, "link", "set", "lo", "up"},
	} {
		if err := run(args...); err != nil {
			nw.t.Fatal(err)
		}
	}
	return n
}

// cut takes the node off the network (true) or puts it back (false).
func (nw *network) cut(n *node, off bool) error {
	state := "up"
	if off {
		state = "down"
	}
	return run("ip", "link", "set", n.veth, state)
}

func (nw *network) remove() {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	for _, n := range nw.nodes {
		if err := run("ip", "netns", "del", n.ns); err != nil {
			nw.t.Errorf("remove namespace: %v", err)
		}
		_ = run("ip", "link", "del", n.veth) // gone with its peer's namespace, normally
	}
	if err := run("ip", "link", "del", nw.bridge); err != nil {
		nw.t.Errorf("remove bridge: %v", err)
	}
}
