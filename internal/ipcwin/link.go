package ipcwin

import (
	"errors"
	"fmt"
	"math"

	"github.com/distbuf/distbuf/internal/bytesize"
	"github.com/distbuf/distbuf/internal/cudart"
)

const (
	// Align aligns each message in a window.
	Align = 256
	// MinWindow is the smallest window. A window grows by at least
	// doubling, so a run makes each peer open a new one a few times at
	// most: opening one is slow.
	MinWindow = 4 << 20
)

// Link is one rank's windows and events towards its node-local peers.
type Link struct {
	dev             *cudart.Device
	ready, consumed cudart.Event // this rank's
	peers           map[int]*peer
	own             window
	retired         []uintptr // earlier windows: a peer may still have them open
	readBy          []int     // the peers this rank's window held messages for since its last wait for them
	// Kernel sends batches to the gather kernel (internal/gather): where
	// the GPU is shared through MPS the ranks' device operations queue
	// behind one another and one launch per batch beats a copy per span;
	// without MPS the processes take the GPU in turns and
	// cudaMemcpyBatchAsync is faster (docs/PERFORMANCE.md). Cleared once
	// the kernel turns out unavailable.
	Kernel bool
	// Into gathers an exchange's copies into this rank's window, From its
	// copies out of its peers' windows.
	Into, From Batch
	Notices    Notices
}

// window is this rank's window of one generation.
type window struct {
	ptr    uintptr
	size   int64
	gen    uint64
	handle cudart.IpcMemHandle
}

// peer is what this rank knows of a peer: its events' handles, the events
// as opened here, and its window as opened here.
type peer struct {
	readyH, consumedH cudart.IpcEventHandle
	ready, consumed   cudart.Event // 0 until opened
	win               *peerWindow
}

type peerWindow struct {
	gen  uint64
	ptr  uintptr
	size int64 // what cuMemGetAddressRange says, not what the peer does
}

// New makes a link on dev with its two interprocess events; the gather
// kernel takes the batches where dev is shared through MPS.
func New(dev *cudart.Device) (*Link, error) {
	l := &Link{dev: dev, peers: map[int]*peer{}, Kernel: dev.MPSEnabled()}
	var err error
	if l.ready, err = dev.EventCreateInterprocess(); err != nil {
		return nil, err
	}
	if l.consumed, err = dev.EventCreateInterprocess(); err != nil {
		_ = dev.EventDestroy(l.ready)
		return nil, err
	}
	l.Notices = Notices{dev: dev, ready: l.ready}
	return l, nil
}

// Device is the device the link's windows and events live on.
func (l *Link) Device() *cudart.Device { return l.dev }

// EventHandles are the IPC handles of this rank's ready and consumed
// events, for its peers.
func (l *Link) EventHandles() (ready, consumed cudart.IpcEventHandle, err error) {
	if ready, err = l.dev.IpcGetEventHandle(l.ready); err == nil {
		consumed, err = l.dev.IpcGetEventHandle(l.consumed)
	}
	return ready, consumed, err
}

// AddPeer records peer rank's events, which this rank opens when it first
// waits for them.
func (l *Link) AddPeer(rank int, ready, consumed cudart.IpcEventHandle) {
	l.peers[rank] = &peer{readyH: ready, consumedH: consumed}
}

// OpenEvents opens peer rank's ready and consumed events now, so that a
// handle this rank cannot open is found at setup, not in an exchange.
func (l *Link) OpenEvents(rank int) error {
	if _, err := l.peerEvent(rank, true); err != nil {
		return fmt.Errorf("ipcwin: rank %d's ready event: %w", rank, err)
	}
	if _, err := l.peerEvent(rank, false); err != nil {
		return fmt.Errorf("ipcwin: rank %d's consumed event: %w", rank, err)
	}
	return nil
}

// Peers is how many peers the link has.
func (l *Link) Peers() int { return len(l.peers) }

// Reserve readies this rank's window for total bytes of messages: the
// stream s waits until every peer that read the window since the last
// Reserve is done with it, and a window too small is replaced by a larger
// one (after sync, which must wait for s: the old window stays allocated
// and its copies run on).
func (l *Link) Reserve(s cudart.Stream, sync func() error, total int64) error {
	if total == 0 {
		return nil
	}
	for _, r := range l.readBy {
		ev, err := l.peerEvent(r, false)
		if err == nil {
			err = l.dev.StreamWaitEvent(s, ev)
		}
		if err != nil {
			return fmt.Errorf("ipcwin: wait until rank %d has read this rank's window: %w", r, err)
		}
	}
	l.readBy = l.readBy[:0]
	if total <= l.own.size {
		return nil
	}
	size := max(MinWindow, 2*l.own.size, (total+(2<<20)-1)&^(2<<20-1))
	if err := sync(); err != nil {
		return err
	}
	w, err := l.dev.Malloc(size)
	if err != nil {
		return fmt.Errorf("ipcwin: window of %s: %w", bytesize.Format(size), err)
	}
	h, err := l.dev.IpcGetMemHandle(w)
	if err != nil {
		return errors.Join(fmt.Errorf("ipcwin: window: %w", err), l.dev.Free(w))
	}
	if l.own.ptr != 0 {
		l.retired = append(l.retired, l.own.ptr)
	}
	l.own = window{ptr: w, size: size, gen: l.own.gen + 1, handle: h}
	return nil
}

// Window is this rank's window: its address, size, generation and IPC
// handle.
func (l *Link) Window() (ptr uintptr, size int64, gen uint64, handle cudart.IpcMemHandle) {
	return l.own.ptr, l.own.size, l.own.gen, l.own.handle
}

// Placed records that the window holds a message for peer dest: the next
// Reserve waits until dest has read it.
func (l *Link) Placed(dest int) { l.readBy = append(l.readBy, dest) }

// Ready records the ready event on s, after this exchange's copies into
// the window.
func (l *Link) Ready(s cudart.Stream) error { return l.dev.EventRecord(l.ready, s) }

// Consumed records the consumed event on s, after this exchange's copies
// out of the peers' windows.
func (l *Link) Consumed(s cudart.Stream) error { return l.dev.EventRecord(l.consumed, s) }

// WaitReady makes s wait for peer src's ready event.
func (l *Link) WaitReady(src int, s cudart.Stream) error {
	ev, err := l.peerEvent(src, true)
	if err != nil {
		return err
	}
	return l.dev.StreamWaitEvent(s, ev)
}

// peerEvent opens peer r's ready or consumed event, once.
func (l *Link) peerEvent(r int, ready bool) (cudart.Event, error) {
	p := l.peers[r]
	if p == nil {
		return 0, fmt.Errorf("ipcwin: rank %d is no peer of this link", r)
	}
	ev, h := &p.consumed, p.consumedH
	if ready {
		ev, h = &p.ready, p.readyH
	}
	if *ev == 0 {
		e, err := l.dev.IpcOpenEventHandle(h)
		if err != nil {
			return 0, err
		}
		*ev = e
	}
	return *ev, nil
}

// PeerError is a peer's window that cannot be used as its notice says:
// Field names the notice's field at fault (ipc_generation, ipc_window or
// ipc_handle).
type PeerError struct {
	Field, Reason string
}

func (e *PeerError) Error() string { return fmt.Sprintf("ipcwin: %s: %s", e.Field, e.Reason) }

// Open returns the address and size (as this rank's runtime sees the
// allocation) of peer src's window of generation gen, opening it from its
// handle the first time. A later generation replaces the earlier one,
// whose mapping is let go after sync, which must wait for this rank's
// copies out of it. A notice that names an earlier generation than one
// already seen, a size beyond int64, a handle that cannot be opened or
// that does not name the start of an allocation is a *PeerError.
func (l *Link) Open(src int, gen, size uint64, handle cudart.IpcMemHandle, sync func() error) (uintptr, int64, error) {
	p := l.peers[src]
	if p == nil {
		return 0, 0, fmt.Errorf("ipcwin: rank %d is no peer of this link", src)
	}
	switch w := p.win; {
	case w != nil && w.gen == gen:
		return w.ptr, w.size, nil
	case w != nil && gen < w.gen:
		return 0, 0, &PeerError{"ipc_generation", fmt.Sprintf("window generation %d after %d", gen, w.gen)}
	case size > math.MaxInt64:
		return 0, 0, &PeerError{"ipc_window", fmt.Sprintf("a window of %d bytes", size)}
	case w != nil:
		if err := sync(); err != nil {
			return 0, 0, err
		}
		if err := l.dev.IpcCloseMemHandle(w.ptr); err != nil {
			return 0, 0, fmt.Errorf("ipcwin: close rank %d's old window: %w", src, err)
		}
		p.win = nil
	}
	ptr, err := l.dev.IpcOpenMemHandle(handle)
	if err != nil {
		return 0, 0, &PeerError{"ipc_handle", fmt.Sprintf("cannot open rank %d's window: %v", src, err)}
	}
	base, real, err := l.dev.AddressRange(ptr)
	if err == nil && base != ptr {
		err = fmt.Errorf("the handle names memory starting %d bytes into an allocation", ptr-base)
	}
	if err != nil {
		_ = l.dev.IpcCloseMemHandle(ptr)
		return 0, 0, &PeerError{"ipc_handle", fmt.Sprintf("rank %d's window: %v", src, err)}
	}
	p.win = &peerWindow{gen: gen, ptr: ptr, size: min(real, int64(size))}
	return ptr, p.win.size, nil
}

// CloseImports lets go of what this rank opened of its peers: their
// windows and events. The caller has waited for its streams first.
func (l *Link) CloseImports() error {
	var errs []error
	for _, p := range l.peers {
		if p.win != nil {
			errs = append(errs, l.dev.IpcCloseMemHandle(p.win.ptr))
			p.win = nil
		}
		for _, ev := range []*cudart.Event{&p.ready, &p.consumed} {
			if *ev != 0 {
				errs = append(errs, l.dev.EventDestroy(*ev))
				*ev = 0
			}
		}
	}
	return errors.Join(errs...)
}

// Free frees this rank's windows, events and kept notices, once every
// peer has let go of them (CloseImports everywhere).
func (l *Link) Free() error {
	var errs []error
	for _, w := range append(l.retired, l.own.ptr) {
		if w != 0 {
			errs = append(errs, l.dev.Free(w))
		}
	}
	l.retired, l.own = nil, window{}
	errs = append(errs, l.DestroyEvents(), l.Notices.Free())
	return errors.Join(errs...)
}

// DestroyEvents destroys this rank's events: all that Free frees of a
// link that never reserved a window.
func (l *Link) DestroyEvents() error {
	var errs []error
	for _, ev := range []*cudart.Event{&l.ready, &l.consumed} {
		if *ev != 0 {
			errs = append(errs, l.dev.EventDestroy(*ev))
			*ev = 0
		}
	}
	return errors.Join(errs...)
}
