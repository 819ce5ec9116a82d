// Command registry is the Docker tests' local image registry: the
// in-memory registry of go-containerregistry's pkg/registry on a loopback
// port, behind HTTP basic auth when -user is given. It prints the address
// it listens on as its first line and serves until it is killed; GET
// /_requests lists the requests it answered. It is its
// own module so that the product never depends on go-containerregistry.
package main

import (
	"crypto/subtle"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"

	"github.com/google/go-containerregistry/pkg/registry"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "address to listen on")
	user := flag.String("user", "", "basic-auth user; empty: no auth")
	pass := flag.String("pass", "", "basic-auth password")
	flag.Parse()
	lis, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	var h http.Handler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if *user != "" {
		h = basicAuth(h, *user, *pass)
	}
	h = logRequests(h)
	fmt.Println(lis.Addr().String())
	log.Fatal(http.Serve(lis, h))
}

// logRequests keeps "METHOD PATH STATUS" of each request the registry
// answers, and serves them, one a line, at GET /_requests (outside any
// auth) for the tests to count the pulls it served. A request is kept as
// its status is written, before the client can have the answer: once a
// pull is over, GET /_requests lists every request of it.
func logRequests(next http.Handler) http.Handler {
	var mu sync.Mutex // guards lines
	var lines []string
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/_requests" {
			mu.Lock()
			body := strings.Join(lines, "\n")
			mu.Unlock()
			_, _ = io.WriteString(w, body)
			return
		}
		sw := &status{ResponseWriter: w, keep: func(code int) {
			mu.Lock()
			lines = append(lines, fmt.Sprintf("%s %s %d", r.Method, r.URL.Path, code))
			mu.Unlock()
		}}
		next.ServeHTTP(sw, r)
		sw.WriteHeader(http.StatusOK) // kept once: a no-op if it was
	})
}

// status keeps the status of an answer when it is first written.
type status struct {
	http.ResponseWriter
	keep  func(code int)
	wrote bool
}

func (s *status) WriteHeader(code int) {
	if s.wrote {
		return
	}
	s.wrote = true
	s.keep(code)
	s.ResponseWriter.WriteHeader(code)
}

func (s *status) Write(b []byte) (int, error) {
	s.WriteHeader(http.StatusOK)
	return s.ResponseWriter.Write(b)
}

// basicAuth refuses every request without the user and password, with the
// challenge the engine answers with the credentials it was given.
func basicAuth(next http.Handler, user, pass string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok || subtle.ConstantTimeCompare([]byte(u), []byte(user)) != 1 || subtle.ConstantTimeCompare([]byte(p), []byte(pass)) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="runnerd-test"`)
			w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}
