package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/allockind"
	"github.com/distbuf/distbuf/internal/benchtimer"
	"github.com/distbuf/distbuf/internal/nccl"
	"github.com/distbuf/distbuf/internal/ranksettings"
	"github.com/distbuf/distbuf/internal/rawmpi"
	"github.com/distbuf/distbuf/internal/wire"
	"github.com/distbuf/distbuf/msg"
	"github.com/distbuf/distbuf/packing"
)

// Tags of the baselines: apart from the exchanger's.
const (
	tagPerBlock = 201
	tagRaw      = 202
)

// exchangeRun.run measures package msg under mpirun -n 2: each rank sends N
// blocks of B bytes to the other and receives N, timed from "blocks ready
// in their buffers" to "received views usable", the median over at least
// 20 repetitions of the slower rank's time.
//
//	packed      msg.Exchanger.Exchange: one message per peer (count
//	            exchange, manifest; the receiver reuses the plan of the
//	            previous, byte-equal layout)
//	packed-cold the same with two layouts taking turns, so that every
//	            exchange decodes its manifest and builds its plan
//	persistent  msg.Pattern.Exchange: the same with a learned pattern
//	packed-mpi  packed on an exchanger made with msg.TransportMPI: its
//	            messages travel through MPI even where the two ranks share
//	            a node and packed reads them from each other's memory
//	            (route says which the peer takes)
//	perblock    one MPI message per block through cluster: the baseline
//	raw         one MPI_Isend/MPI_Irecv of the packed message's bytes, in C
//
// With raw, two more baselines run in the same rounds: raw-payload, the
// payload's bytes alone, and raw-protocol (rawmpi.Protocol), the MPI calls
// of a packed-mpi exchange in C with none of msg's work: the count
// Alltoall, the send, the probe and matched receive, the agreement
// Alltoall. A msg mode's <mode>_over_protocol is its time over that floor.
//
// With a msg mode, the bounded Alltoall of one int64 per rank that ends
// every exchange (the agreement; cluster.AlltoallWithin) is timed in the
// same rounds, alone, and reported as agreement_alltoall_us with the msg
// mode's ratio to raw without it.
//
// These four run on host memory (a host allocator even when -backend cuda
// is given), taking turns in rounds so that all see the same machine load
// (defaults: 1000 blocks of 256 B). Mode device (defaults: 256
// blocks of 1 MiB, needs the CUDA backend) exchanges device buffers and
// compares the exchange bandwidth with plain pinned device-to-host and
// host-to-device copies measured in the same run.
func (r exchangeRun) run(c *benchContext) error {
	if c.world == nil || c.world.Size() != 2 {
		n := 1
		if c.world != nil {
			n = c.world.Size()
		}
		return fmt.Errorf("exchange needs exactly 2 ranks (mpirun -n 2 with distbench built with -tags mpi), have %d", n)
	}
	if len(r.modes) > 0 {
		if err := benchExchangeHost(c, r); err != nil {
			return err
		}
	}
	if r.device == deviceYes || r.device == deviceOnCUDA && c.alloc.Info().Backend == devalloc.BackendCUDA {
		return benchExchangeDevice(c, r)
	}
	return nil
}

// exchangeRun is what `distbench exchange` runs, resolved from the flags:
// what the ranks agree on before they start.
type exchangeRun struct {
	modes  []string // the host modes, taking turns; none: no host part
	device deviceChoice
	host   exchangeSize // the host modes' blocks
	dev    exchangeSize // the device mode's blocks
	reps   int          // repetitions of each mode
}

// deviceChoice says whether the device mode runs.
type deviceChoice int

const (
	deviceNo     deviceChoice = iota
	deviceYes                 // -mode device
	deviceOnCUDA              // the default set: when the allocator is CUDA's
)

// exchangeSize is the N blocks of B bytes each rank sends.
type exchangeSize struct {
	blocks     int
	blockBytes int64
}

// exchangeModes are the host modes, in the order the default set runs them.
var exchangeModes = []string{"packed", "packed-cold", "persistent", "packed-mpi", "perblock", "raw"}

// resolveExchange applies the defaults to cfg: the modes (every host mode,
// and device on the CUDA backend, when -mode is not given), the block
// counts and sizes (1000 blocks of 256 B for the host modes, 256 of 1 MiB
// for device, when not given) and the repetitions (at least 20). On error
// the run is the zero run, whose settings have the same names.
func resolveExchange(cfg config) (benchPlan, error) {
	var r exchangeRun
	switch m := strings.TrimSpace(cfg.mode); {
	case m == "":
		r.modes, r.device = exchangeModes, deviceOnCUDA
	case m == "device":
		r.device = deviceYes
	default:
		// One mode, or several separated by commas, which take turns.
		for _, one := range strings.Split(m, ",") {
			one = strings.TrimSpace(one)
			if !slices.Contains(exchangeModes, one) {
				return exchangeRun{}, fmt.Errorf("-mode %q: exchange has modes %v (one, or several separated by commas) and device", cfg.mode, exchangeModes)
			}
			r.modes = append(r.modes, one)
		}
	}
	size := func(defBlocks int, defBytes int64) (exchangeSize, error) {
		s := exchangeSize{blocks: cfg.blocks, blockBytes: cfg.blockBytes}
		if s.blocks == 0 {
			s.blocks = defBlocks
		}
		if s.blockBytes == 0 {
			s.blockBytes = defBytes
		}
		if s.blockBytes%8 != 0 {
			return s, fmt.Errorf("-block-bytes %d: want a multiple of 8 (float64 blocks)", s.blockBytes)
		}
		return s, nil
	}
	var err error
	if len(r.modes) > 0 {
		if r.host, err = size(1000, 256); err != nil {
			return exchangeRun{}, err
		}
	}
	if r.device != deviceNo {
		if r.dev, err = size(256, 1<<20); err != nil {
			return exchangeRun{}, err
		}
	}
	r.reps = max(cfg.iters, 20)
	return r, nil
}

// settings are the resolved values the ranks compare: those of a part that
// does not run are 0.
func (r exchangeRun) settings() []ranksettings.Setting {
	modes := slices.Clone(r.modes)
	switch r.device {
	case deviceYes:
		modes = append(modes, "device")
	case deviceOnCUDA:
		modes = append(modes, "device on the CUDA backend")
	}
	number := ranksettings.Number
	return []ranksettings.Setting{
		ranksettings.Text("-mode", strings.Join(modes, ",")),
		number("repetitions (-iters, at least 20)", int64(r.reps)),
		number("-blocks of the host modes", int64(r.host.blocks)),
		number("-block-bytes of the host modes", r.host.blockBytes),
		number("-blocks of the device mode", int64(r.dev.blocks)),
		number("-block-bytes of the device mode", r.dev.blockBytes),
	}
}

// exchangeSetup is what every mode of one run shares.
type exchangeSetup struct {
	c        *benchContext
	a        *devalloc.Allocator
	comm     *cluster.Comm
	peer     int
	n        int
	bytes    int64
	plan     *packing.Plan // the N blocks for the peer (the peer's are alike)
	recvPlan *packing.Plan // what arrives: the same layout, one group
	send     []*packing.Coalesced
	other    []*packing.Coalesced // the same blocks under other ids
}

func newExchangeSetup(c *benchContext, a *devalloc.Allocator, size exchangeSize) (*exchangeSetup, error) {
	n, b := size.blocks, size.blockBytes
	e := &exchangeSetup{c: c, a: a, comm: c.world, peer: 1 - c.world.Rank(), n: n, bytes: b}
	descs := make([]packing.Desc, n)
	for i := range descs {
		descs[i] = packing.Desc{ID: uint64(i), DType: packing.Float64, Rows: 1, Cols: int(b / 8), Dest: e.peer}
	}
	var err error
	if e.plan, err = packing.NewPlan(descs, packing.Options{}); err != nil {
		return nil, err
	}
	for i := range descs {
		descs[i].Dest = 0
	}
	if e.recvPlan, err = packing.NewPlan(descs, packing.Options{}); err != nil {
		return nil, err
	}
	s := a.DefaultStream()
	if e.send, err = msg.AllocSend(a, e.plan, s); err != nil {
		return nil, err
	}
	for i := range descs {
		descs[i].ID, descs[i].Dest = uint64(n+i), e.peer
	}
	other, err := packing.NewPlan(descs, packing.Options{})
	if err != nil {
		return nil, err
	}
	if e.other, err = msg.AllocSend(a, other, s); err != nil {
		return nil, err
	}
	if err := s.Memset(e.send[0].Buffer(), 0, e.send[0].Buffer().Size(), byte(1+c.world.Rank())); err != nil {
		return nil, err
	}
	return e, s.Synchronize()
}

func (e *exchangeSetup) close() {
	for _, b := range append(e.send, e.other...) {
		_ = b.Free()
	}
}

// payload is the bytes of the N blocks; wire adds the manifest.
func (e *exchangeSetup) payload() int64 { return e.send[0].Size() }
func (e *exchangeSetup) wire() int64    { return int64(wire.PayloadOffset(e.n)) + e.payload() }

// slowest turns per-rank samples into the slower rank's time of each
// repetition.
func (e *exchangeSetup) slowest(xs []float64) ([]float64, error) {
	out := make([]float64, len(xs))
	return out, cluster.Allreduce(e.comm, xs, out, cluster.Max)
}

// timed runs f between two barriers' worth of synchronisation and returns
// its duration in microseconds.
func (e *exchangeSetup) timed(f func() error) (float64, error) {
	if err := e.comm.Barrier(); err != nil {
		return 0, err
	}
	start := time.Now()
	err := f()
	return float64(time.Since(start).Nanoseconds()) / 1e3, err
}

func benchExchangeHost(c *benchContext, r exchangeRun) error {
	modes := r.modes
	a := c.alloc
	if a.Info().Backend == devalloc.BackendCUDA {
		host, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost})
		if err != nil {
			return err
		}
		defer func() { _ = host.Close() }()
		a = host
	}
	e, err := newExchangeSetup(c, a, r.host)
	if err != nil {
		return err
	}
	defer e.close()
	x, err := msg.New(msg.Options{Comm: e.comm, Alloc: a})
	if err != nil {
		return err
	}
	defer func() { _ = x.Close() }()
	pat := x.NewPattern()
	var xm *msg.Exchanger
	if slices.Contains(modes, "packed-mpi") {
		if xm, err = msg.New(msg.Options{Comm: e.comm, Alloc: a, Transport: msg.TransportMPI}); err != nil {
			return err
		}
		defer func() { _ = xm.Close() }()
	}
	rawSend, err := a.Alloc(e.wire(), a.DefaultStream())
	if err != nil {
		return err
	}
	defer func() { _ = rawSend.Free() }()
	rawRecv, err := a.Alloc(e.wire(), a.DefaultStream())
	if err != nil {
		return err
	}
	defer func() { _ = rawRecv.Free() }()
	if err := a.Sync(); err != nil {
		return err
	}

	comm, err := e.comm.Dup()
	if err != nil {
		return err
	}
	defer func() { _ = comm.Free() }()
	counts := make([]int64, 4)
	cold := 0
	// A C baseline moving the whole message each way.
	rawMode := func(name string, f func(send uintptr, sendBytes int64, recv uintptr, recvBytes int64, peer, tag int) (int64, error)) func() error {
		return func() error {
			sa, _, _, _ := rawSend.Region()
			ra, _, _, _ := rawRecv.Region()
			got, err := f(sa, e.wire(), ra, e.wire(), e.peer, tagRaw)
			if err == nil && got != e.wire() {
				err = fmt.Errorf("%s: received %d bytes, want %d", name, got, e.wire())
			}
			return err
		}
	}
	run := map[string]func() error{
		"packed": func() error {
			r, err := x.Exchange(e.send)
			if err == nil {
				err = r.Free()
			}
			return err
		},
		"packed-cold": func() error {
			cold++
			send := e.send
			if cold%2 == 1 {
				send = e.other
			}
			r, err := x.Exchange(send)
			if err == nil {
				err = r.Free()
			}
			return err
		},
		"packed-mpi": func() error {
			r, err := xm.Exchange(e.send)
			if err == nil {
				err = r.Free()
			}
			return err
		},
		"persistent": func() error {
			r, err := pat.Exchange(e.send)
			if err == nil {
				err = r.Free()
			}
			return err
		},
		"perblock":     func() error { return e.perBlock() },
		"raw":          rawMode("raw", rawmpi.Exchange),
		"raw-protocol": rawMode("raw-protocol", rawmpi.Protocol),
		"raw-payload": func() error {
			sa, _, _, _ := rawSend.Region()
			ra, _, _, _ := rawRecv.Region()
			_, err := rawmpi.Exchange(sa, e.payload(), ra, e.payload(), e.peer, tagRaw)
			return err
		},
		// The collective of the agreement that ends every exchange (and of
		// the count exchange): cluster's bounded Alltoall of an int64 per
		// rank, as msg runs it.
		"alltoall": func() error { return cluster.AlltoallWithin(comm, counts[:2], counts[2:], msg.DefaultTimeout) },
	}
	measured := append([]string(nil), modes...)
	if slices.Contains(modes, "raw") {
		measured = append(measured, "raw-payload", "raw-protocol")
	}
	if slices.Contains(modes, "packed") || slices.Contains(modes, "packed-cold") || slices.Contains(modes, "persistent") || slices.Contains(modes, "packed-mpi") {
		measured = append(measured, "alltoall")
	}
	// Modes take turns in rounds, each running a batch of repetitions
	// after a warm-up one: turns share the machine's load, batches keep
	// each mode's own working set warm, as it would be in a loop of its own.
	reps := r.reps
	const rounds = 5
	batch := (reps + rounds - 1) / rounds
	samples := map[string][]float64{}
	for range rounds {
		for _, m := range measured {
			for i := range batch + 1 {
				us, err := e.timed(run[m])
				if err != nil {
					return fmt.Errorf("mode %s: %w", m, err)
				}
				if i > 0 {
					samples[m] = append(samples[m], us)
				}
			}
		}
	}
	reps = rounds * batch
	med, spread := map[string]float64{}, map[string][2]float64{}
	for _, m := range measured {
		slow, err := e.slowest(samples[m])
		if err != nil {
			return err
		}
		med[m] = benchtimer.Median(slow) // sorts slow
		spread[m] = [2]float64{slow[len(slow)/10], slow[len(slow)*9/10]}
	}
	if c.world.Rank() != 0 {
		return nil
	}
	for _, m := range modes {
		extra := map[string]any{"reps": reps, "block_bytes": e.bytes, "wire_bytes": e.wire(), "payload_bytes": e.payload(),
			"p10_us": spread[m][0], "p90_us": spread[m][1]}
		switch m {
		case "packed", "packed-cold", "persistent", "packed-mpi":
			ex := x
			if m == "packed-mpi" {
				ex = xm
			}
			st := ex.Stats()
			extra["mpi_messages_per_exchange"] = float64(st.MPISends) / float64(st.Exchanges)
			// Whether the peer's message was read from its memory (one
			// node, host memory: msg's node-local reads) or carried by MPI.
			routes, why := ex.Routes()
			extra["route"] = routes[e.peer].String()
			if routes[e.peer] != msg.RouteRead {
				extra["reads_why_not"] = why
			}
			if p, ok := med["perblock"]; ok {
				extra["perblock_over_"+m] = p / med[m]
				extra["goal_perblock_over_packed"] = 5
			}
			if r, ok := med["raw"]; ok {
				extra[m+"_over_raw"] = med[m] / r
				extra[m+"_over_raw_payload"] = med[m] / med["raw-payload"]
				extra[m+"_over_protocol"] = med[m] / med["raw-protocol"]
				extra["goal_packed_over_raw"] = 1.15
			}
			// What the agreement costs: its collective alone, timed in
			// the same rounds, and the ratio to raw without it.
			extra["agreement_alltoall_us"] = med["alltoall"]
			if r, ok := med["raw"]; ok {
				extra[m+"_over_raw_without_agreement"] = (med[m] - med["alltoall"]) / r
			}
		case "raw":
			extra["raw_payload_us"] = med["raw-payload"]
			extra["protocol_us"] = med["raw-protocol"]
			extra["protocol_over_raw"] = med["raw-protocol"] / med["raw"]
		case "perblock":
			extra["mpi_messages_per_exchange"] = e.n
		}
		if err := c.emit(benchResult{Bench: "exchange", Mode: m, N: e.n, Bytes: int64(e.n) * e.bytes, MedianUS: med[m], Backend: allockind.Name(a), Extra: extra}); err != nil {
			return err
		}
	}
	return nil
}

// perBlock is the baseline: every block its own MPI message, received into
// its slot of one pooled buffer, which then holds the views.
func (e *exchangeSetup) perBlock() error {
	a, s := e.a, e.a.DefaultStream()
	sendC := e.send[0]
	recv, err := a.Alloc(max(e.recvPlan.Groups()[0].Bytes, 1), s)
	if err != nil {
		return err
	}
	wh, err := recv.Hold(devalloc.Write)
	if err != nil {
		return errors.Join(err, recv.Free())
	}
	rh, err := sendC.Buffer().Hold(devalloc.Read)
	if err != nil {
		return errors.Join(err, wh.Release(), recv.Free())
	}
	err = errors.Join(wh.Wait(), rh.Wait())
	reqs := make([]*cluster.Request, 0, 2*e.n)
	for _, v := range sendC.All() {
		if err != nil {
			break
		}
		var r *cluster.Request
		if r, err = e.comm.Irecv(cluster.Sub(recv, v.Offset(), v.Desc().Bytes()), e.peer, tagPerBlock); err == nil {
			reqs = append(reqs, r)
		}
	}
	for _, v := range sendC.All() {
		if err != nil {
			break
		}
		var r *cluster.Request
		if r, err = e.comm.Isend(cluster.Sub(sendC.Buffer(), sendC.Start()+v.Offset(), v.Desc().Bytes()), e.peer, tagPerBlock); err == nil {
			reqs = append(reqs, r)
		}
	}
	err = errors.Join(err, cluster.Waitall(reqs), wh.Release(), rh.Release())
	if err != nil {
		return errors.Join(err, recv.Free())
	}
	got, err := packing.Wrap(recv, 0, e.recvPlan, 0, nil)
	if err != nil {
		return errors.Join(err, recv.Free())
	}
	return got.Free()
}

// benchExchangeDevice exchanges device buffers of N*B bytes each way and
// compares the bandwidth with pinned copies measured in the same run, both
// ranks copying at once as they do during the exchange (on one GPU they
// share its copy engines and its link).
func benchExchangeDevice(c *benchContext, r exchangeRun) error {
	a := c.alloc
	if a.Info().Backend != devalloc.BackendCUDA {
		return fmt.Errorf("-mode device needs the CUDA backend (-backend cuda), have %s", allockind.Name(a))
	}
	e, err := newExchangeSetup(c, a, r.dev)
	if err != nil {
		return err
	}
	defer e.close()
	x, err := msg.New(msg.Options{Comm: e.comm, Alloc: a})
	if err != nil {
		return err
	}
	defer func() { _ = x.Close() }()
	s := a.DefaultStream()
	size := e.payload()
	pin, err := a.AllocPinned(size, s)
	if err != nil {
		return err
	}
	defer func() { _ = pin.Free() }()
	dev, err := a.Alloc(size, s)
	if err != nil {
		return err
	}
	defer func() { _ = dev.Free() }()
	// What MPI alone does with the message's bytes in pinned memory, both
	// ranks sending at once: the ceiling of any staged exchange.
	wire := e.wire()
	mpiSend, err := a.AllocPinned(wire, s)
	if err != nil {
		return err
	}
	defer func() { _ = mpiSend.Free() }()
	mpiRecv, err := a.AllocPinned(wire, s)
	if err != nil {
		return err
	}
	defer func() { _ = mpiRecv.Free() }()
	if err := s.Synchronize(); err != nil {
		return err
	}
	copyUS := func(dst, src *devalloc.Buffer) (float64, error) {
		return e.timed(func() error {
			if err := s.Copy(dst, 0, src, 0, size); err != nil {
				return err
			}
			return s.Synchronize()
		})
	}
	// The same exchange through msg over NCCL, when every rank has its own
	// GPU (New decides, collectively).
	xn, err := msg.New(msg.Options{Comm: e.comm, Alloc: a, Tag: x.Tag() + 1, Transport: msg.TransportNCCL})
	if err != nil {
		return err
	}
	defer func() { _ = xn.Close() }()
	ncclRoutes, ncclWhy := xn.Routes()
	overNCCL := ncclRoutes[e.peer] == msg.RouteNCCL
	exchangeWith := func(x *msg.Exchanger) (float64, error) {
		var r *msg.Received
		us, err := e.timed(func() error {
			var err error
			if r, err = x.Exchange(e.send); err != nil {
				return err
			}
			// Views usable: the copies into the received buffer are done.
			h, err := r.From(e.peer).Buffer().Hold(devalloc.Read)
			if err != nil {
				return err
			}
			return errors.Join(h.Wait(), h.Release())
		})
		if r != nil {
			err = errors.Join(err, r.Free())
		}
		return us, err
	}
	exchange := func() (float64, error) { return exchangeWith(x) }
	rawMPI := func() (float64, error) {
		sa, _, _, err := mpiSend.Region()
		if err != nil {
			return 0, err
		}
		ra, _, _, err := mpiRecv.Region()
		if err != nil {
			return 0, err
		}
		return e.timed(func() error {
			got, err := rawmpi.Exchange(sa, wire, ra, wire, e.peer, tagRaw)
			if err == nil && got != wire {
				err = fmt.Errorf("raw: received %d bytes, want %d", got, wire)
			}
			return err
		})
	}
	reps := r.reps
	var d2h, h2d, ex, mpiHost, exNCCL []float64
	for rep := range reps + 2 {
		a1, err := copyUS(pin, e.send[0].Buffer())
		if err != nil {
			return fmt.Errorf("device-to-host copy: %w", err)
		}
		a2, err := copyUS(dev, pin)
		if err != nil {
			return fmt.Errorf("host-to-device copy: %w", err)
		}
		a3, err := exchange()
		if err != nil {
			return fmt.Errorf("exchange: %w", err)
		}
		a4, err := rawMPI()
		if err != nil {
			return fmt.Errorf("raw MPI exchange of pinned memory: %w", err)
		}
		a5 := 0.0
		if overNCCL {
			if a5, err = exchangeWith(xn); err != nil {
				return fmt.Errorf("exchange over nccl: %w", err)
			}
		}
		if rep >= 2 {
			d2h, h2d, ex, mpiHost, exNCCL = append(d2h, a1), append(h2d, a2), append(ex, a3), append(mpiHost, a4), append(exNCCL, a5)
		}
	}
	for _, xs := range []*[]float64{&d2h, &h2d, &ex, &mpiHost, &exNCCL} {
		if *xs, err = e.slowest(*xs); err != nil {
			return err
		}
	}
	unusable := ""
	if !overNCCL {
		unusable = ncclWhy
	}
	nc, ncclNote, err := ncclExchange(c, e, reps, unusable)
	if err != nil {
		return fmt.Errorf("nccl exchange: %w", err)
	}
	if c.world.Rank() != 0 {
		return nil
	}
	gbps := func(us float64) float64 { return float64(size) / us / 1e3 }
	mD2H, mH2D, mEx, mMPI := benchtimer.Median(d2h), benchtimer.Median(h2d), benchtimer.Median(ex), benchtimer.Median(mpiHost)
	st := x.Stats()
	routes, _ := x.Routes()
	transport := routes[e.peer].String()
	msgNCCL := map[string]any{"transport": ncclRoutes[e.peer].String(), "why_not": unusable}
	if overNCCL {
		m := benchtimer.Median(exNCCL)
		msgNCCL["median_us"] = m
		msgNCCL["exchange_gbps"] = gbps(m)
		msgNCCL["ratio_to_min_copy"] = gbps(m) / min(gbps(mD2H), gbps(mH2D))
		msgNCCL["meets_goal_ratio"] = gbps(m)/min(gbps(mD2H), gbps(mH2D)) >= 0.8
	}
	return c.emit(benchResult{Bench: "exchange", Mode: "device", N: e.n, Bytes: size, MedianUS: mEx, Extra: map[string]any{
		"msg_nccl": msgNCCL,
		"reps":     reps, "transport": transport, "chunk_bytes": x.ChunkBytes(),
		"exchange_gbps": gbps(mEx), "pinned_d2h_gbps": gbps(mD2H), "pinned_h2d_gbps": gbps(mH2D),
		"ratio_to_min_copy": gbps(mEx) / min(gbps(mD2H), gbps(mH2D)), "goal_ratio": 0.8,
		"mpi_pinned_gbps": float64(wire) / mMPI / 1e3, "ratio_to_mpi_pinned": mMPI / mEx,
		"mpi_sends_per_exchange": float64(st.MPISends) / float64(st.Exchanges),
		"nccl":                   ncclNote,
		"nccl_gbps":              ncclGbps(nc, e),
		"nccl_over_staged":       ncclSpeedup(nc, mEx),
	}})
}

// ncclExchange sends the same send buffers device to device through NCCL
// (bootstrapped through MPI), when every rank can load libnccl, and checks
// every byte received. It returns the slower rank's time of each repetition,
// or nil and the reason NCCL was not used.
func ncclExchange(c *benchContext, e *exchangeSetup, reps int, unusable string) ([]float64, string, error) {
	// msg.New has decided, collectively, whether every rank can use NCCL
	// (libnccl loads, one GPU per rank): the same conditions hold here.
	if unusable != "" {
		return nil, "not used: " + unusable, nil
	}
	a, s := e.a, e.a.DefaultStream()
	lib, err := nccl.Load()
	if err != nil {
		return nil, "", err
	}
	id := make([]byte, nccl.UniqueIDBytes)
	if e.comm.Rank() == 0 {
		var err error
		if id, err = lib.UniqueID(); err != nil {
			return nil, "", err
		}
	}
	if err := cluster.Bcast(e.comm, id, 0); err != nil {
		return nil, "", err
	}
	comm, err := lib.NewComm(id, e.comm.Size(), e.comm.Rank(), a.Info().Device)
	if err != nil {
		return nil, "", err
	}
	defer func() { _ = comm.Close() }()
	send := e.send[0].Buffer()
	recv, err := a.Alloc(send.Size(), s)
	if err != nil {
		return nil, "", err
	}
	defer func() { _ = recv.Free() }()
	sendAddr, _, _, _ := send.Region()
	recvAddr, _, _, _ := recv.Region()
	n := send.Size()
	once := func() error {
		r, err := send.Read(s)
		if err != nil {
			return err
		}
		w, err := recv.Write(s)
		if err != nil {
			return errors.Join(err, r.Done())
		}
		err = comm.SendRecv(s.Handle(), []nccl.Transfer{{Addr: sendAddr, Bytes: n, Peer: e.peer}},
			[]nccl.Transfer{{Addr: recvAddr, Bytes: n, Peer: e.peer}})
		return errors.Join(err, r.Done(), w.Done(), s.Synchronize())
	}
	var ts []float64
	for rep := range reps + 2 {
		us, err := e.timed(once)
		if err != nil {
			return nil, "", err
		}
		if rep >= 2 {
			ts = append(ts, us)
		}
	}
	// Every byte of the blocks came from the peer, whose blocks hold its
	// rank + 1 (the prefix before them holds whatever manifest msg wrote).
	pin, err := a.AllocPinned(n, s)
	if err != nil {
		return nil, "", err
	}
	defer func() { _ = pin.Free() }()
	if err := errors.Join(s.Copy(pin, 0, recv, 0, n), s.Synchronize()); err != nil {
		return nil, "", err
	}
	mem, err := pin.Bytes()
	if err != nil {
		return nil, "", err
	}
	start := e.send[0].Start()
	for i, b := range mem[start:] {
		i += int(start)
		if b != byte(1+e.peer) {
			return nil, "", fmt.Errorf("byte %d received through NCCL is %d, want %d", i, b, 1+e.peer)
		}
	}
	if ts, err = e.slowest(ts); err != nil {
		return nil, "", err
	}
	v, _ := lib.Version()
	return ts, fmt.Sprintf("%s (version %d), every byte verified", lib.Library(), v), nil
}

func ncclGbps(ts []float64, e *exchangeSetup) float64 {
	if len(ts) == 0 {
		return 0
	}
	return float64(e.send[0].Buffer().Size()) / benchtimer.Median(append([]float64(nil), ts...)) / 1e3
}

func ncclSpeedup(ts []float64, staged float64) float64 {
	if len(ts) == 0 {
		return 0
	}
	return staged / benchtimer.Median(append([]float64(nil), ts...))
}
