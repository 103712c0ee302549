//go:build mpi

package msg

import (
	"fmt"
	"testing"
	"time"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/mpitest"
	"github.com/distbuf/distbuf/packing"
	"github.com/stretchr/testify/require"
)

// The stall tests' times. They are correctness tests with generous slack,
// not timings: the timeout is short so that the run stays short, a stop
// lasts well past the others' bound (the timeout and the agreement's
// grace, agreeTimeout), and the slack covers a loaded 2-core machine
// running 4 ranks under the race detector.
const (
	stallTimeout = 500 * time.Millisecond
	stallSlack   = 2 * time.Second
	stallFor     = 2*stallTimeout + stallSlack + time.Second
	stallResync  = time.Minute // the bound of the collectives that bring the ranks back in step
)

// stallTraffic has every rank send every rank a few small blocks: each
// message fits MPI's eager protocol, so a send completes without its
// receiver, as the ranks' sends to a stopped rank must for it to find
// them once resumed.
func stallTraffic(it uint64) traffic {
	return traffic{seed: 77, iter: it, density: 1, maxBlocks: 3, dims: []int{4, 6}, dtypes: []packing.DType{packing.Float64}}
}

// stallPlace is where in an exchange the stalled rank stops.
type stallPlace int

const (
	stallInData    stallPlace = iota // once its messages are prepared, before it sends any
	stallBeforeAgr                   // once its data phase is over, before the agreement
	stallBefore                      // before it calls the exchange (of a learned pattern)
)

// TestStalledRank: the last rank stops inside an exchange, well past the
// others' timeout. Every other rank's exchange fails within the timeout,
// the agreement's grace and slack, with an error matching ErrTimeout and
// cluster.ErrTimeout whose *cluster.TimeoutError names the stopped rank,
// instead of waiting for it for ever. The stopped rank, once resumed,
// finishes its exchange (an error or, when it stopped after its data
// phase, the data: the others' parts of the agreement were sent before
// they gave up), and a bounded barrier on the exchanger's communicator
// brings the ranks back in step. At 2 and 4 ranks (msg's MPI runs reach
// both).
func TestStalledRank(t *testing.T) {
	comm := world(t)
	rank, size := comm.Rank(), comm.Size()
	if size != 2 && size != 4 {
		t.Skip("the stall tests run at 2 and 4 ranks")
	}
	stalled := size - 1
	for _, tc := range []struct {
		name  string
		where stallPlace
		how   string
	}{
		{"where=data/stop=sigstop", stallInData, "sigstop"},
		{"where=agreement/stop=sleep", stallBeforeAgr, "sleep"},
		{"where=learned-exchange/stop=sigstop", stallBefore, "sigstop"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := variant{name: "host", kind: devalloc.BackendHost}.open(t)
			o := Options{Comm: comm, Alloc: a, Transport: TransportMPI, Timeout: stallTimeout}
			if rank == stalled {
				o.Timeout = stallResync // it finds everything there once resumed
			}
			x := newExchanger(t, o)
			s := a.DefaultStream()
			tr := stallTraffic(1)
			bufs, err := AllocSend(a, tr.plan(t, rank, size), s)
			require.NoError(t, err)
			defer freeAll(t, bufs)
			tr.fill(t, s, rank, bufs)
			ex := x.Exchange
			if tc.where == stallBefore {
				pat := x.NewPattern()
				require.NoError(t, exchangeVerified(t, pat.Exchange, s, tr, rank, size, bufs).Free())
				ex = pat.Exchange
			}
			if rank == stalled {
				var once bool
				x.fault(func(f *faultyRoute) {
					hook := func(*exchange) {
						if !once {
							once = true
							mpitest.Stop(t, tc.how, stallFor)
						}
					}
					switch tc.where {
					case stallInData:
						f.onPrepared = hook
					case stallBeforeAgr:
						f.onReceived = hook
					}
				})
				if tc.where == stallBefore {
					mpitest.Stop(t, tc.how, stallFor)
				}
				r, err := ex(bufs)
				if err == nil {
					require.NoError(t, r.Free())
				}
				t.Logf("the stalled rank, resumed: %v", err)
			} else {
				start := time.Now()
				r, err := ex(bufs)
				took := time.Since(start)
				require.Nil(t, r)
				require.ErrorIs(t, err, ErrTimeout)
				require.ErrorIs(t, err, cluster.ErrTimeout)
				var te *cluster.TimeoutError
				require.ErrorAs(t, err, &te)
				require.Contains(t, te.Missing, stalled, "the rank not heard from: %v", err)
				require.ErrorContains(t, err, fmt.Sprintf("rank %d", stalled))
				bound := stallTimeout + min(stallTimeout, agreeGrace) + stallSlack
				require.GreaterOrEqual(t, took, stallTimeout, "nothing gives up before the timeout")
				require.LessOrEqual(t, took, bound, "the exchange took %v with rank %d stopped: %v", took, stalled, err)
				t.Logf("rank %d gave up after %v: %v", rank, took.Round(time.Millisecond), err)
			}
			// In step again: every rank's collectives on the exchanger's
			// communicator meet, and the timeout is resolved.
			require.NoError(t, x.comm.BarrierWithin(stallResync))
		})
	}
}

// TestShortStall: a rank that stops for less than the timeout, in its
// data phase or before the agreement, costs no error: every rank gets
// its data.
func TestShortStall(t *testing.T) {
	comm := world(t)
	rank, size := comm.Rank(), comm.Size()
	if size != 2 && size != 4 {
		t.Skip("the stall tests run at 2 and 4 ranks")
	}
	const timeout, stop = 5 * time.Second, 700 * time.Millisecond
	for _, where := range []stallPlace{stallInData, stallBeforeAgr} {
		for _, how := range []string{"sleep", "sigstop"} {
			t.Run(fmt.Sprintf("where=%d/stop=%s", where, how), func(t *testing.T) {
				a, x, _, _ := onHost(t, Options{Transport: TransportMPI, Timeout: timeout})
				if rank == size-1 {
					var once bool
					x.fault(func(f *faultyRoute) {
						hook := func(*exchange) {
							if !once {
								once = true
								mpitest.Stop(t, how, stop)
							}
						}
						if where == stallInData {
							f.onPrepared = hook
						} else {
							f.onReceived = hook
						}
					})
				}
				s := a.DefaultStream()
				tr := stallTraffic(2)
				bufs, err := AllocSend(a, tr.plan(t, rank, size), s)
				require.NoError(t, err)
				defer freeAll(t, bufs)
				r := exchangeVerified(t, x.Exchange, s, tr, rank, size, bufs)
				require.NoError(t, r.Free())
				require.Zero(t, x.Stats().Timeouts)
			})
		}
	}
}
