package msg

import (
	"fmt"
	"slices"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/wire"
	"github.com/distbuf/distbuf/packing"
)

// layoutCache is what an exchanger keeps of the block layouts it has
// described, so that a solver whose sweeps repeat their layouts describes
// each layout once: the send manifest last built for each destination, the
// layout last received from each source, and the manifest each send
// buffer's prefix holds since the last exchange. It belongs to one
// exchanger and is used by one exchange at a time, under the exchanger's
// lock.
type layoutCache struct {
	// sent is, by destination, the manifest of the last layout sent there.
	sent map[int]*outManifest
	// received is, by source, the layout of the last message received:
	// the next one with byte-equal entries reuses its plan.
	received map[int]*learnedIn
	// written records, for each send buffer of the last exchange, the
	// manifest its prefix holds, so that the next exchange of the same
	// buffer and layout rewrites only the header. writtenNext is the map
	// the running exchange fills in its place (then they swap), kept so
	// that neither is built anew each exchange.
	written, writtenNext map[writtenAt]*outManifest
	// inScratch holds decoded entries between decoding and FromManifest,
	// and outScratch a send buffer's entries between listing and encoding.
	inScratch, outScratch []packing.Entry
}

func newLayoutCache() layoutCache {
	return layoutCache{sent: map[int]*outManifest{}, received: map[int]*learnedIn{},
		written: map[writtenAt]*outManifest{}, writtenNext: map[writtenAt]*outManifest{}}
}

// forSend returns the manifest of send buffer c, for rank d: the learned
// pattern's or the one last sent to d while c has the layout it
// describes, else one built anew (built says so).
func (lc *layoutCache) forSend(d int, c *packing.Coalesced, pat *Pattern) (man *outManifest, built bool, err error) {
	man = lc.sent[d]
	if pat != nil && pat.learned && pat.sendOut[d] != nil {
		man = pat.sendOut[d]
	}
	if man != nil && man.plan == c.Plan() && man.group == c.Group() {
		return man, false, nil
	}
	if man, lc.outScratch, err = buildManifest(c, lc.outScratch); err != nil {
		return nil, false, err
	}
	lc.sent[d] = man
	return man, true, nil
}

// expected is the layout a message from src should (learned: a learned
// pattern requires it), or likely does, have: the pattern's, else the last
// one from src.
func (lc *layoutCache) expected(src int, pat *Pattern) (known *learnedIn, learned bool) {
	if pat != nil && pat.learned {
		return pat.recv[src], true
	}
	return lc.received[src], false
}

// decode checks and decodes the entries of a manifest man from src whose
// header h wire.DecodeHeader accepted, builds the plan of its payload, and
// keeps the layout as src's last.
func (lc *layoutCache) decode(h wire.Header, man []byte, src, tag int) (*learnedIn, error) {
	// The entries go into a scratch slice kept for the next decoding
	// (FromManifest keeps none of it).
	pe, err := wire.DecodeEntries(h, man, src, tag, lc.inScratch)
	lc.inScratch = pe[:0]
	if err != nil {
		return nil, err
	}
	plan, err := packing.FromManifest(pe, int64(h.PayloadLen))
	if err != nil {
		return nil, wireErr(ErrMalformed, src, tag, "entries", "%v", err)
	}
	l := &learnedIn{layout: wire.ReceivedLayout(h, man), plan: plan}
	lc.received[src] = l
	return l, nil
}

// startExchange empties the record of the prefixes the running exchange
// writes.
func (lc *layoutCache) startExchange() { clear(lc.writtenNext) }

// prefixHolds reports whether the prefix at at already holds man's
// entries, written by the last exchange.
func (lc *layoutCache) prefixHolds(at writtenAt, man *outManifest) bool {
	w, ok := lc.written[at]
	return ok && w == man
}

// wrote records that the running exchange wrote man into the prefix at at.
func (lc *layoutCache) wrote(at writtenAt, man *outManifest) { lc.writtenNext[at] = man }

// endExchange makes what the exchange wrote the record for the next one;
// after a failure no prefix is trusted.
func (lc *layoutCache) endExchange(failed bool) {
	lc.written, lc.writtenNext = lc.writtenNext, lc.written
	if failed {
		clear(lc.written)
	}
}

// outManifest is a send buffer's manifest, encoded once per layout (the
// entries in offset order, and what the header needs), and the plan group
// it describes.
type outManifest struct {
	*wire.Layout
	plan  *packing.Plan
	group int
}

// writtenAt is where a manifest was written: a send buffer and the offset
// of the message in it (parts of one joined buffer each have their own).
type writtenAt struct {
	buf *devalloc.Buffer
	off int64
}

// buildManifest lists c's blocks in offset order, as the wire format wants.
// A NewPlan layout lists each shape class in one run and classes one after
// another, so the entries go to their places without a sort; other layouts
// are sorted. scratch holds the entries between listing and encoding; it is
// returned, grown as needed, for the next call.
func buildManifest(c *packing.Coalesced, scratch []packing.Entry) (*outManifest, []packing.Entry, error) {
	p := c.Plan()
	n := c.Len()
	entries := slices.Grow(scratch[:0], n)[:n]
	classes := p.Classes()
	group := p.Groups()[c.Group()].Classes
	// first[ci] is the index of class ci's first entry. Classes are few and
	// a slice indexed by class costs a load where a map costs a hash.
	var firstBuf [64]int
	first := firstBuf[:]
	if len(classes) > len(first) {
		first = make([]int, len(classes))
	}
	regular := true
	next := 0
	for _, ci := range group {
		cl := &classes[ci]
		regular = regular && cl.Regular && cl.Stride > 0
		first[ci] = next
		next += cl.Count
	}
	common, mixed := packing.DType(0), false
	for k, v := range c.All() {
		d := v.Desc()
		e := packing.Entry{ID: d.ID, Offset: v.Offset(), Rows: d.Rows, Cols: d.Cols, DType: d.DType}
		if k == 0 {
			common = e.DType
		} else if e.DType != common {
			mixed = true
		}
		pos := k
		if regular {
			ci, off, _ := c.Locate(k)
			cl := &classes[ci]
			pos = first[ci] + int((off-cl.Offset)/cl.Stride)
		}
		entries[pos] = e
	}
	if !slices.IsSortedFunc(entries, byOffset) {
		slices.SortFunc(entries, byOffset)
	}
	dtype := common
	if mixed || n == 0 {
		dtype = wire.Mixed
	}
	l, err := wire.NewLayout(dtype, uint64(c.Size()), entries)
	if err != nil {
		return nil, entries, fmt.Errorf("msg: the layout of the send buffer for rank %d cannot be described: %w", c.Dest(), err)
	}
	return &outManifest{Layout: l, plan: p, group: c.Group()}, entries, nil
}

// sameLayout reports whether two received layouts list the same blocks at
// the same offsets in payloads of the same size.
func sameLayout(a, b *packing.Plan) bool {
	if a == b {
		return true
	}
	if a.Len() != b.Len() || a.Groups()[0].Bytes != b.Groups()[0].Bytes {
		return false
	}
	ea, na, erra := a.Manifest(0)
	eb, nb, errb := b.Manifest(0)
	return erra == nil && errb == nil && na == nb && slices.Equal(ea, eb)
}

func byOffset(a, b packing.Entry) int {
	switch {
	case a.Offset < b.Offset:
		return -1
	case a.Offset > b.Offset:
		return 1
	}
	return 0
}

// learnedIn is what is kept of a received layout: by a pattern, and by the
// exchanger for the last message from each source.
type learnedIn struct {
	layout *wire.Layout // nil for a message to self, which has no manifest
	plan   *packing.Plan
	// A message to self copied without MPI has no entries: its plan was
	// made from the send layout (group fromGroup of plan from), and serves
	// again while the send buffers keep that layout.
	from      *packing.Plan
	fromGroup int
}

// wireLayout is the layout a message from the same source is checked
// against, nil when there is none.
func (l *learnedIn) wireLayout() *wire.Layout {
	if l == nil {
		return nil
	}
	return l.layout
}
