// Command registry is the Docker tests' local image registry: the
// in-memory registry of go-containerregistry's pkg/registry on a loopback
// port, behind HTTP basic auth when -user is given. It prints the address
// it listens on as its first line and serves until it is killed. It is its
// own module so that the product never depends on go-containerregistry.
package main

import (
	"crypto/subtle"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"

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
	var h http.Handler = registry.New(registry.Logger(log.New(os.Stderr, "registry: ", 0)))
	if *user != "" {
		h = basicAuth(h, *user, *pass)
	}
	fmt.Println(lis.Addr().String())
	log.Fatal(http.Serve(lis, h))
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
