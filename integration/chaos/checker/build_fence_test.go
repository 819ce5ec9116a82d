//go:build !chaos_broken_fence

package checker

// brokenFence says this test binary was built with the store's broken
// fence (controlplane/store/sqlstore/fence_broken.go): false here.
const brokenFence = false
