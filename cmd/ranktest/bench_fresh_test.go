package main

import (
	"testing"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/benchtimer"
	"github.com/distbuf/distbuf/msg"
	"github.com/distbuf/distbuf/packing"
)

// BenchmarkFreshPlanning is the host's work of a solve on a fresh block
// structure at the default workload, one rank, from its block lists to its
// GEMM plan: the layouts of A and B and of C, C's send join, the exchange
// pattern, the solve's two allocations (which a repeated solve makes too)
// and the GEMM plan on them, over four structures in turn as the sweep's
// bonds. cpu-us is the process's CPU time per solve, steadier than ns/op
// where other processes share the cores.
func BenchmarkFreshPlanning(b *testing.B) {
	world, err := cluster.World()
	if err != nil {
		b.Fatal(err)
	}
	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost, Warn: func(string) {}})
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	sv, err := newSolver(config{mode: "packed", bonds: defaultBonds, seed: 1}, world, a)
	if err != nil {
		b.Fatal(err)
	}
	defer sv.close()
	for bond := range defaultBonds {
		sv.bondData(bond)
	}
	plan := func(bd *bondData) error {
		l := &layout{bond: bd}
		defer l.close()
		var err error
		if l.planAB, l.planC, err = bd.descs.plans(); err != nil {
			return err
		}
		if l.joinC, err = msg.JoinSend(l.planC); err != nil {
			return err
		}
		l.pattern = sv.ex.NewPattern()
		C, err := packing.Alloc(sv.a, l.joinC, sv.s)
		if err != nil {
			return err
		}
		defer C.Free()
		AB, err := packing.Alloc(sv.a, l.planAB, sv.s)
		if err != nil {
			return err
		}
		defer AB.Free()
		parts, err := AB.Parts()
		if err != nil {
			return err
		}
		return sv.gemmPlan(l, parts[0], parts[1], C)
	}
	b.ReportAllocs()
	cpu0 := benchtimer.ProcessCPU()
	i := 0
	for b.Loop() {
		if err := plan(sv.bonds[i%defaultBonds]); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64((benchtimer.ProcessCPU()-cpu0).Nanoseconds())/1e3/float64(b.N), "cpu-us")
}
