//go:build !mpi

package msg

const mpiBuild = false
