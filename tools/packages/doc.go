// Package packages pins the tools `make packages` runs, in a module of
// their own so that the product's go.mod does not carry them:
//
//	go tool -modfile=tools/packages/go.mod nfpm …
//
// nfpm (github.com/goreleaser/nfpm/v2) builds the .deb packages from
// deploy/packages/*.yaml (deploy/packages/build.sh).
package packages
