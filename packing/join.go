package packing

import (
	"fmt"
	"slices"

	"github.com/distbuf/distbuf"
)

// joinInfo is what a joined plan keeps of the plan it was made from.
type joinInfo struct {
	from   *Plan
	starts []int64 // where each group of from begins in the joined layout
}

// Joined returns a single-group plan that lays every destination group of p
// out in one buffer, one after another in the order of p.Groups: group g
// begins prefix(g) bytes after the end of the group before it (a nil
// prefix reserves nothing), and inside it every block sits where p places
// it in the group's own buffer. A computation that writes all destinations
// at once (one allocation, one padding clear, one GEMM plan with the joined
// plan's indices, which are p's) uses the joined plan; Coalesced.Parts
// then gives each group of p over the same buffer, to send. Each prefix
// must be a non-negative multiple of p's Align, so that every group keeps
// its alignment. The joined group has no destination of its own (NoDest).
// A plan made by FromManifest has a single group and cannot be joined.
func (p *Plan) Joined(prefix func(g int) int64) (*Plan, error) {
	if p == nil {
		return nil, fmt.Errorf("packing: joined: nil plan: %w", distbuf.ErrInvalid)
	}
	if p.manifest() {
		return nil, fmt.Errorf("packing: joined: a plan from a manifest: %w", distbuf.ErrInvalid)
	}
	starts := make([]int64, len(p.groups))
	var end int64
	for g := range p.groups {
		var pre int64
		if prefix != nil {
			pre = prefix(g)
		}
		if pre < 0 || pre%p.opts.Align != 0 {
			return nil, fmt.Errorf("packing: joined: group %d: prefix %d misaligned: want a non-negative multiple of %d: %w", g, pre, p.opts.Align, distbuf.ErrInvalid)
		}
		if pre > MaxBytes-end || p.groups[g].Bytes > MaxBytes-end-pre {
			return nil, fmt.Errorf("packing: joined: too large: the groups and their prefixes exceed 2^50 bytes: %w", distbuf.ErrInvalid)
		}
		starts[g] = end + pre
		end = starts[g] + p.groups[g].Bytes
	}
	q := &Plan{opts: p.opts, ids: p.ids, id0: p.id0, idStep: p.idStep, meta: p.meta, rankBits: p.rankBits, rankMask: p.rankMask,
		join: &joinInfo{from: p, starts: starts}}
	q.classes = slices.Clone(p.classes)
	order := make([]int, 0, len(p.classes))
	for g := range p.groups {
		for _, ci := range p.groups[g].Classes {
			q.classes[ci].Group, q.classes[ci].Offset = 0, p.classes[ci].Offset+starts[g]
			order = append(order, ci)
		}
	}
	if p.offs != nil {
		q.offs = make([]int64, len(p.offs))
		for i, off := range p.offs {
			q.offs[i] = off + starts[p.class(i).Group]
		}
	}
	q.group0[0] = Group{Dest: NoDest, Blocks: p.Len(), Bytes: end, Classes: order}
	q.groups = q.group0[:]
	return q, nil
}

// joinedFrom returns the plan a joined plan was made from and where each of
// its groups begins in the joined layout; ok is false for a plan not made by
// Joined. The slice is the plan's: do not modify it.
func (p *Plan) joinedFrom() (from *Plan, starts []int64, ok bool) {
	if p == nil || p.join == nil {
		return nil, nil, false
	}
	return p.join.from, p.join.starts, true
}

// Parts returns, for a buffer laid out by a joined plan (Plan.Joined), the
// Coalesced of each group of the plan it was joined from, in the order of
// its Groups, over this buffer: each begins at its group's place, with the
// group's prefix before it, and is what a message to that group's
// destination is made from. A part owns nothing. It is valid while c is:
// once c is freed every use of a part returns distbuf.ErrFreed, and a part's own
// Free is refused (free c).
func (c *Coalesced) Parts() ([]*Coalesced, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	from, starts, ok := c.plan.joinedFrom()
	if !ok {
		return nil, fmt.Errorf("packing: parts of buffer #%d: its plan is not a joined one: %w", c.buf.ID(), distbuf.ErrInvalid)
	}
	parts := make([]*Coalesced, len(starts))
	for g, at := range starts {
		part, err := wrap(c.buf, c.start+at, from, g)
		if err != nil {
			return nil, err
		}
		part.owner = c
		parts[g] = part
	}
	return parts, nil
}
