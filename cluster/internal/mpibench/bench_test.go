//go:build mpi

package mpibench

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/distbuf/distbuf/cluster"
)

var world *cluster.Comm

// threadMode is the design the benchmarks measure: funnelled when
// DISTBUF_MPI_THREAD asks for it, else every goroutine calling MPI
// (Init fails if MPI cannot provide that, rather than measuring the
// fallback under the wrong label).
var threadMode = cluster.ThreadMultiple

func TestMain(m *testing.M) {
	flag.Parse()
	if strings.HasPrefix(strings.ToLower(os.Getenv("DISTBUF_MPI_THREAD")), "funnel") {
		threadMode = cluster.ThreadFunneled
	}
	if err := cluster.InitWith(cluster.Options{Thread: threadMode}); err != nil {
		fmt.Fprintln(os.Stderr, "Init:", err)
		os.Exit(1)
	}
	w, err := cluster.World()
	if err != nil {
		fmt.Fprintln(os.Stderr, "World:", err)
		os.Exit(1)
	}
	world = w
	if f := flag.Lookup("test.bench"); f != nil && f.Value.String() != "" {
		// Both ranks must run each benchmark the same number of times.
		if bt := flag.Lookup("test.benchtime").Value.String(); !strings.HasSuffix(bt, "x") {
			fmt.Fprintf(os.Stderr, "mpibench: run with -test.benchtime=Nx (got %s): every rank must run the same iterations\n", bt)
			os.Exit(2)
		}
		if w.Rank() != 0 {
			// One rank reports; the other only answers.
			if null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0); err == nil {
				_ = syscall.Dup3(int(null.Fd()), 1, 0)
			}
		}
	}
	code := m.Run()
	if err := cluster.Finalize(); err != nil {
		fmt.Fprintln(os.Stderr, "Finalize:", err)
		code = 1
	}
	os.Exit(code)
}

func needTwoRanks(tb testing.TB) {
	if world.Size() != 2 {
		tb.Skipf("needs exactly 2 ranks, have %d", world.Size())
	}
}

func buffers(tb testing.TB, n int) (send, recv *Buffer) {
	var err error
	if send, err = NewBuffer(n); err != nil {
		tb.Fatal(err)
	}
	if recv, err = NewBuffer(n); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { send.Free(); recv.Free() })
	return send, recv
}

func fill(b []byte, seed int) {
	for i := range b {
		b[i] = byte(seed*131 + i*7 + i>>8)
	}
}

func sameAs(b []byte, seed int) bool {
	want := make([]byte, len(b))
	fill(want, seed)
	return string(b) == string(want)
}

// TestLoopsMoveData checks that both loops really exchange the data the
// benchmarks time.
func TestLoopsMoveData(t *testing.T) {
	needTwoRanks(t)
	const n = 70000
	peer := 1 - world.Rank()
	for _, impl := range []string{"c", "go"} {
		send, recv := buffers(t, n)
		fill(send.Bytes(), world.Rank()+10)
		clear(recv.Bytes())
		if impl == "c" {
			PingPongC(send, recv, n, 3)
		} else if _, err := PingPongGo(world, send, recv, 3); err != nil {
			t.Fatal(err)
		}
		if !sameAs(recv.Bytes(), peer+10) {
			t.Fatalf("impl=%s: ping-pong delivered wrong bytes", impl)
		}
		const window, size = 8, 100
		buf, _ := buffers(t, window*size)
		if world.Rank() == 0 {
			fill(buf.Bytes(), 77)
		} else {
			clear(buf.Bytes())
		}
		if impl == "c" {
			MessageRateC(buf, size, window, 2)
		} else {
			slots := make([]cluster.Memory, window)
			for k := range slots {
				slots[k] = cluster.Sub(buf, int64(k*size), size)
			}
			if _, err := MessageRateGo(world, slots, buf, 2); err != nil {
				t.Fatal(err)
			}
		}
		if !sameAs(buf.Bytes(), 77) {
			t.Fatalf("impl=%s: message-rate loop delivered wrong bytes", impl)
		}
	}
}

var pingPongSizes = []int{8, 64, 512, 4 << 10, 32 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20}

func funnelled() bool { return threadMode == cluster.ThreadFunneled }

func threadLabel() string { return threadMode.String() }

// chunkFor is how many round trips (or windows) run back to back before
// switching between the C and the Go loop: a few milliseconds' worth, so
// both see the same load on a shared machine.
func chunkFor(bytes int) int {
	switch {
	case bytes <= 4<<10:
		return 200
	case bytes <= 64<<10:
		return 50
	case bytes <= 1<<20:
		return 10
	}
	return 3
}

// paired runs b.N iterations of each loop, alternating chunks of them, and
// reports the median over chunk pairs of each loop's time per iteration
// and of their ratio. In the funnelled design, where only the init thread
// may call MPI, the C loop cannot run and only Go is reported.
func paired(b *testing.B, bytes int, cLoop, goLoop func(iters int) (float64, error), report func(b *testing.B, cSecs, goSecs float64)) {
	if err := world.Barrier(); err != nil {
		b.Fatal(err)
	}
	chunk := chunkFor(bytes)
	var cTimes, goTimes, ratios []float64
	b.ResetTimer()
	for done := 0; done < b.N; done += chunk {
		k := min(chunk, b.N-done)
		var cs float64
		if !funnelled() {
			var err error
			if cs, err = cLoop(k); err != nil {
				b.Fatal(err)
			}
			cTimes = append(cTimes, cs/float64(k))
		}
		gs, err := goLoop(k)
		if err != nil {
			b.Fatal(err)
		}
		goTimes = append(goTimes, gs/float64(k))
		if cs > 0 {
			ratios = append(ratios, gs/cs)
		}
	}
	b.StopTimer()
	report(b, median(cTimes), median(goTimes))
	if len(ratios) > 0 {
		b.ReportMetric(median(ratios), "go/c")
	}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// BenchmarkPingPong: one op is a round trip of each loop. Reported: the
// one-way latency of each (median over chunks), the Go loop's one-way
// bandwidth, and go/c, the median ratio of Go to C time over chunk pairs.
func BenchmarkPingPong(b *testing.B) {
	needTwoRanks(b)
	for _, n := range pingPongSizes {
		b.Run(fmt.Sprintf("bytes=%d/thread=%s", n, threadLabel()), func(b *testing.B) {
			send, recv := buffers(b, n)
			fill(send.Bytes(), 1)
			paired(b, n,
				func(k int) (float64, error) { return PingPongC(send, recv, n, k), nil },
				func(k int) (float64, error) { return PingPongGo(world, send, recv, k) },
				func(b *testing.B, c, g float64) {
					if c > 0 {
						b.ReportMetric(c/2*1e6, "c-us/oneway")
					}
					b.ReportMetric(g/2*1e6, "go-us/oneway")
					b.ReportMetric(float64(n)/(g/2)/1e6, "go-MB/s")
				})
		})
	}
}

const rateWindow = 64

// BenchmarkMessageRate: one op is a window of 64 messages and its
// acknowledgement, in each loop.
func BenchmarkMessageRate(b *testing.B) {
	needTwoRanks(b)
	for _, n := range []int{8, 512} {
		b.Run(fmt.Sprintf("bytes=%d/thread=%s", n, threadLabel()), func(b *testing.B) {
			buf, ack := buffers(b, rateWindow*n)
			slots := make([]cluster.Memory, rateWindow)
			for k := range slots {
				slots[k] = cluster.Sub(buf, int64(k*n), int64(n))
			}
			ackMem := cluster.Sub(ack, 0, 0)
			paired(b, 0,
				func(k int) (float64, error) { return MessageRateC(buf, n, rateWindow, k), nil },
				func(k int) (float64, error) { return MessageRateGo(world, slots, ackMem, k) },
				func(b *testing.B, c, g float64) {
					if c > 0 {
						b.ReportMetric(rateWindow/c, "c-msgs/s")
					}
					b.ReportMetric(rateWindow/g, "go-msgs/s")
				})
		})
	}
}
