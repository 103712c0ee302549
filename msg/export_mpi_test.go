//go:build mpi

package msg

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/cudart"
)

// The tests' faulty peers and probes: routes wrapped around the real ones
// (faultyRoute) and collectives that alter what this rank announces
// (faultyCounts). Nothing here is reached from the product's code but
// through the route and collectives interfaces.

// wrapRoutes puts a wrapper made by wrap around every route of the
// exchanger: one wrapper per route, for all its peers, which takes the
// route's place in every exchange's steps too.
func (x *Exchanger) wrapRoutes(wrap func(r route) route) {
	made := map[route]route{}
	for p, r := range x.routes {
		w, ok := made[r]
		if !ok {
			w = wrap(r)
			made[r] = w
		}
		x.routes[p] = w
	}
	for i, r := range x.steps {
		if w, ok := made[r]; ok {
			x.steps[i] = w
		}
	}
}

// fault wraps every route of x in a faultyRoute configured by set, and
// returns the wrappers.
func (x *Exchanger) fault(set func(f *faultyRoute)) []*faultyRoute {
	var out []*faultyRoute
	x.wrapRoutes(func(r route) route {
		f := &faultyRoute{route: r, x: x}
		set(f)
		out = append(out, f)
		return f
	})
	return out
}

// faultyCounts announces what announce makes of this rank's counts.
type faultyCounts struct {
	collectives
	announce func(sizes []int64)
}

func (f faultyCounts) counts(send, recv []int64, timeout time.Duration) error {
	f.announce(send)
	return f.collectives.counts(send, recv, timeout)
}

// faultyRoute is a route that plays a faulty peer, or watches the steps of
// an exchange, around the real route of its peers.
type faultyRoute struct {
	route
	x *Exchanger
	// replace replaces the MPI messages of a message to dest (whole: what
	// the route would send through MPI: the message, or its notice); nil
	// keeps them.
	replace func(dest int, whole []byte) [][]byte
	// extra adds MPI messages to dest after this rank's own, if any.
	extra func(dest int) [][]byte
	// mangle alters the whole message (manifest and payload) to dest as it
	// is sent, from a host send buffer.
	mangle func(dest int, whole []byte)
	// canary puts that many bytes on each side of every host-visible
	// region MPI receives into (a receive buffer, a pinned chunk, a
	// notice), filled with canaryByte and checked once the receive
	// completed; canaryHit hears of every one overwritten.
	canary    int64
	canaryHit func(what string)
	// windowCopies, when it returns an error, fails this rank's copies
	// into its window (into) or from its peers' windows with it.
	windowCopies func(into bool) error
	// In each exchange: beforeRecv runs before the first receive of the
	// route is posted, onPrepared once every message is prepared (before
	// the first is posted), onWaited after the first wait of the data
	// phase (the first sends posted, the copy to self made), beforeRead
	// before this rank reads src's message, onReceived once the data
	// phase is over (before the agreement).
	beforeRecv func()
	onPrepared func(e *exchange)
	onWaited   func(e *exchange)
	beforeRead func(src int)
	onReceived func(e *exchange)
	// The epochs of the last exchange that ran beforeRecv and onWaited.
	recvEpoch, waitEpoch uint64

	mu      sync.Mutex
	guarded map[*inChunk]*guarded
}

// guarded is a piece received into guarded scratch memory instead of its
// place.
type guarded struct {
	scratch *devalloc.Buffer
	n       int64
}

const canaryByte = 0xCA

func (f *faultyRoute) prepare(e *exchange, m *outMsg) error {
	if err := f.route.prepare(e, m); err != nil {
		return err
	}
	if f.mangle != nil {
		if err := f.mangleMessage(e, m); err != nil {
			return fmt.Errorf("test: mangle: %w", err)
		}
	}
	if f.replace != nil {
		whole, err := f.sentBytes(e, m)
		if err != nil {
			return fmt.Errorf("test: pieces: %w", err)
		}
		if ps := f.replace(m.dest, whole); ps != nil {
			m.release()
			m.setPieces(ps)
		}
	}
	return nil
}

// window is the window route under f, if it is one.
func (f *faultyRoute) window() *windowRoute {
	w, _ := f.route.(*windowRoute)
	return w
}

// flushIntoWindow enqueues the window copies batched so far, so that
// their sources may change.
func (f *faultyRoute) flushIntoWindow(e *exchange) error {
	w := f.window()
	if err := w.link.Flush(&w.link.Into, e.x.sendS); err != nil {
		return err
	}
	return e.x.sendS.Synchronize()
}

// sentBytes is a copy of what m's MPI messages carry.
func (f *faultyRoute) sentBytes(e *exchange, m *outMsg) ([]byte, error) {
	if f.window() != nil {
		if err := f.flushIntoWindow(e); err != nil { // the notice is read by a copy into the window
			return nil, err
		}
	}
	var whole []byte
	for i := range m.chunks {
		ch := &m.chunks[i]
		switch {
		case ch.pin != nil:
			whole = append(whole, ch.pin.Bytes()...)
		case ch.notice != nil:
			whole = append(whole, ch.notice.Bytes()[:ch.n]...)
		case ch.slot != nil:
			if err := ch.slot.Wait(); err != nil {
				return nil, err
			}
			whole = append(whole, ch.slot.bytes()[:ch.n]...)
		case ch.buf != nil:
			mem, err := ch.buf.Bytes()
			if err != nil {
				return nil, err
			}
			whole = append(whole, mem[:ch.n]...)
		default:
			if !ch.region.buf.Location().HostAccessible() {
				return nil, errors.New("the message is not in host memory")
			}
			mem, err := ch.region.buf.Bytes()
			if err != nil {
				return nil, err
			}
			whole = append(whole, mem[ch.region.off:ch.region.off+ch.n]...)
		}
	}
	return whole, nil
}

// mangleMessage lets mangle alter m where it is sent from: in its host
// send buffer, or, through a window, the manifest in its notice and the
// payload in the window.
func (f *faultyRoute) mangleMessage(e *exchange, m *outMsg) error {
	x, c := e.x, m.c
	buf := c.Buffer()
	if !buf.Location().HostAccessible() {
		return errors.New("the send buffer is not host memory")
	}
	mem, err := buf.Bytes()
	if err != nil {
		return err
	}
	p := int64(m.man.PayloadOffset())
	w := f.window()
	if w == nil {
		whole := mem[c.Start()-p : c.Start()+c.Size()]
		f.mangle(m.dest, whole)
		// The next exchange writes the whole manifest again.
		delete(x.layouts.writtenNext, writtenAt{buf, c.Start() - p})
		return nil
	}
	if err := f.flushIntoWindow(e); err != nil {
		return err
	}
	notice := m.chunks[0].notice.Bytes()
	man := notice[m.chunks[0].n-p : m.chunks[0].n]
	whole := append(append([]byte(nil), man...), mem[c.Start():c.Start()+c.Size()]...)
	f.mangle(m.dest, whole)
	copy(man, whole[:p])
	if c.Size() == 0 {
		return nil
	}
	pin, err := x.a.AllocPinned(c.Size(), x.sendS)
	if err != nil {
		return err
	}
	defer func() { _ = pin.Free() }()
	pmem, err := pin.Bytes()
	if err != nil {
		return err
	}
	copy(pmem, whole[p:])
	src, _, _, err := pin.Region()
	if err != nil {
		return err
	}
	win, _, _, _ := w.link.Window()
	if err := w.link.Device().MemcpyAsync(win+uintptr(w.offsets[m.dest]+p), src, c.Size(), cudart.Stream(x.sendS.Handle())); err != nil {
		return err
	}
	return x.sendS.Synchronize()
}

func (f *faultyRoute) prepared(e *exchange) {
	if f.windowCopies != nil && f.window() != nil {
		if err := f.windowCopies(true); err != nil {
			w := f.window()
			_ = w.link.Into.Drop()
			w.intoDone(e, err)
			clear(w.into)
			w.into = w.into[:0]
			f.afterPrepared(e)
			return
		}
	}
	f.route.prepared(e)
	f.afterPrepared(e)
}

func (f *faultyRoute) afterPrepared(e *exchange) {
	x := e.x
	if f.extra != nil {
		for d := range x.size {
			if x.routes[d] != route(f) {
				continue
			}
			if ps := f.extra(d); ps != nil {
				m := e.newOut()
				m.dest, m.step, m.route = d, x.size+d, f
				m.setPieces(ps)
				e.outs = append(e.outs, m)
			}
		}
	}
	if f.onPrepared != nil {
		f.onPrepared(e)
	}
}

// failFrom fails the copies out of the peers' windows gathered so far,
// when windowCopies says so.
func (f *faultyRoute) failFrom(e *exchange) bool {
	w := f.window()
	if f.windowCopies == nil || w == nil {
		return false
	}
	err := f.windowCopies(false)
	if err == nil {
		return false
	}
	if len(w.from) > 0 {
		_ = w.link.From.Drop()
		w.fromDone(e, err)
	}
	return true
}

func (f *faultyRoute) waited(e *exchange) {
	if !f.failFrom(e) {
		f.route.waited(e)
	}
	if f.onWaited != nil && f.waitEpoch != e.epoch {
		f.waitEpoch = e.epoch
		f.onWaited(e)
	}
}

func (f *faultyRoute) received(e *exchange) {
	f.failFrom(e)
	f.route.received(e)
	if f.onReceived != nil {
		f.onReceived(e)
	}
}

func (f *faultyRoute) recvMem(e *exchange, in *inMsg, i int, n int64) (cluster.Memory, cluster.Releaser, error) {
	if f.beforeRecv != nil && f.recvEpoch != e.epoch {
		f.recvEpoch = e.epoch
		f.beforeRecv()
	}
	mem, rel, err := f.route.recvMem(e, in, i, n)
	if err != nil || f.canary == 0 {
		return mem, rel, err
	}
	_, size, dev, err := mem.Region()
	if err != nil || dev {
		return mem, rel, err // device memory: no canary
	}
	x, c := e.x, f.canary
	scratch, err := x.a.AllocPinned(size+2*c, x.recvS)
	if err != nil {
		return nil, nil, errors.Join(err, releaseAll(rel))
	}
	smem, err := scratch.Bytes()
	if err != nil {
		return nil, nil, errors.Join(err, scratch.Free(), releaseAll(rel))
	}
	for k := range smem[:size+2*c] {
		smem[k] = canaryByte
	}
	h, err := scratch.Hold(devalloc.Write)
	if err != nil {
		return nil, nil, errors.Join(err, scratch.Free(), releaseAll(rel))
	}
	f.mu.Lock()
	if f.guarded == nil {
		f.guarded = map[*inChunk]*guarded{}
	}
	f.guarded[&in.chunks[i]] = &guarded{scratch: scratch, n: size}
	f.mu.Unlock()
	return cluster.Sub(scratch, c, size), bothReleased{h, rel}, nil
}

func releaseAll(r cluster.Releaser) error {
	if r == nil {
		return nil
	}
	return r.Release()
}

// bothReleased releases two holds as one.
type bothReleased struct{ a, b cluster.Releaser }

func (r bothReleased) Release() error { return errors.Join(releaseAll(r.a), releaseAll(r.b)) }

func (f *faultyRoute) done(e *exchange, in *inMsg, i int) {
	ch := &in.chunks[i]
	f.mu.Lock()
	g := f.guarded[ch]
	delete(f.guarded, ch)
	f.mu.Unlock()
	if g != nil {
		f.unguard(e, in, ch, g)
	}
	if f.beforeRead != nil && in.route.kind() == RouteRead {
		f.beforeRead(in.src)
	}
	f.route.done(e, in, i)
}

// unguard checks the canaries around a guarded piece and moves what
// arrived to the piece's place.
func (f *faultyRoute) unguard(e *exchange, in *inMsg, ch *inChunk, g *guarded) {
	defer func() { _ = g.scratch.Free() }()
	smem, err := g.scratch.Bytes()
	if err != nil {
		f.canaryHit(fmt.Sprintf("the message from rank %d: canaries unreadable: %v", in.src, err))
		return
	}
	c := f.canary
	for side, guard := range map[string][]byte{"before": smem[:c], "after": smem[c+g.n : 2*c+g.n]} {
		for k, v := range guard {
			if v != canaryByte {
				f.canaryHit(fmt.Sprintf("the message from rank %d: canary byte %d %s the region was overwritten", in.src, k, side))
				break
			}
		}
	}
	if !ch.done || ch.err != nil || ch.discarded {
		return
	}
	got := smem[c : c+min(max(ch.got, 0), g.n)]
	switch {
	case ch.notice != nil:
		copy(ch.notice, got)
	case ch.slot != nil:
		copy(ch.slot.bytes(), got)
	case ch.win != nil:
		copy(ch.win.Bytes(), got)
	case ch.buf != nil:
		mem, err := ch.buf.Bytes()
		if err == nil {
			copy(mem, got)
		}
	default:
		mem, err := ch.region.buf.Bytes()
		if err == nil {
			copy(mem[ch.region.off:], got)
		}
	}
}

// agreed checks and frees the guards of pieces whose message ended before
// they completed: every request has completed by now.
func (f *faultyRoute) agreed(e *exchange) {
	f.route.agreed(e)
	f.mu.Lock()
	left := f.guarded
	f.guarded = nil
	f.mu.Unlock()
	for ch, g := range left {
		f.unguard(e, &inMsg{src: -1}, &inChunk{}, g)
		_ = ch
	}
}
