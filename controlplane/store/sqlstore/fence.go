//go:build !chaos_broken_fence

package sqlstore

// fenceOpen and fenceClose wrap the fencing half of guard. In every build
// but the chaos campaign's broken one (fence_broken.go) they are empty:
// the condition stands as written.
const fenceOpen, fenceClose = "", ""

// fenceInGo is the fence's echo where a statement's row is read back
// (renewRows): the attempt's generation and state checked again. Off only
// in the broken build, whose statements let every call through.
const fenceInGo = true
