// Package allockind names the allocator a rank runs on the way results and
// the ranks' agreement report it: host, cuda-pool or cuda-malloc. The
// commands and benchmarks share it so that their JSON lines agree.
package allockind

import "github.com/distbuf/distbuf/devalloc"

// Names lists the allocators in index order; ranks compare indices.
var Names = [...]string{"host", "cuda-pool", "cuda-malloc"}

// Index is the position in Names of the allocator a runs on.
func Index(a *devalloc.Allocator) int {
	switch info := a.Info(); {
	case info.Backend == devalloc.BackendHost:
		return 0
	case info.Pool:
		return 1
	}
	return 2
}

// Name names the allocator a runs on.
func Name(a *devalloc.Allocator) string { return Names[Index(a)] }
