//go:build mpi

package mpibench

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/distbuf/distbuf/cluster"
)

var world *cluster.Comm

func TestMain(m *testing.M) {
	flag.Parse()
	if err := cluster.Init(); err != nil {
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

// implementations lists the loops to run: the C one needs MPI callable
// from any thread, which the funnelled design does not promise.
func implementations() []string {
	if mode, _, _ := cluster.Threading(); mode == cluster.ThreadFunneled {
		return []string{"go"}
	}
	return []string{"c", "go"}
}

func threadLabel() string {
	mode, _, _ := cluster.Threading()
	return mode.String()
}

// BenchmarkPingPong: one op is one round trip. MB/s counts both
// directions, so it is the one-way bandwidth; us/oneway is half a round
// trip.
func BenchmarkPingPong(b *testing.B) {
	needTwoRanks(b)
	for _, n := range pingPongSizes {
		for _, impl := range implementations() {
			b.Run(fmt.Sprintf("bytes=%d/impl=%s/thread=%s", n, impl, threadLabel()), func(b *testing.B) {
				send, recv := buffers(b, n)
				fill(send.Bytes(), 1)
				if err := world.Barrier(); err != nil {
					b.Fatal(err)
				}
				b.SetBytes(int64(2 * n))
				b.ResetTimer()
				var secs float64
				if impl == "c" {
					secs = PingPongC(send, recv, n, b.N)
				} else {
					var err error
					if secs, err = PingPongGo(world, send, recv, b.N); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				b.ReportMetric(secs/float64(b.N)/2*1e6, "us/oneway")
			})
		}
	}
}

const rateWindow = 64

// BenchmarkMessageRate: one op is a window of 64 messages and its
// acknowledgement.
func BenchmarkMessageRate(b *testing.B) {
	needTwoRanks(b)
	for _, n := range []int{8, 512} {
		for _, impl := range implementations() {
			b.Run(fmt.Sprintf("bytes=%d/impl=%s/thread=%s", n, impl, threadLabel()), func(b *testing.B) {
				buf, ack := buffers(b, rateWindow*n)
				slots := make([]cluster.Memory, rateWindow)
				for k := range slots {
					slots[k] = cluster.Sub(buf, int64(k*n), int64(n))
				}
				ackMem := cluster.Sub(ack, 0, 0)
				if err := world.Barrier(); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				var secs float64
				if impl == "c" {
					secs = MessageRateC(buf, n, rateWindow, b.N)
				} else {
					var err error
					if secs, err = MessageRateGo(world, slots, ackMem, b.N); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(rateWindow*b.N)/secs, "msgs/s")
			})
		}
	}
}
