package msg

import (
	"errors"
	"fmt"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/wire"
	"github.com/distbuf/distbuf/packing"
)

// SendPrefix is the room AllocSend reserves before the blocks of group g of
// p: the group's manifest (64 bytes, 32 per block, rounded up to 256:
// docs/WIRE.md) rounded up to the plan's alignment, so the blocks keep
// their alignment in memory.
func SendPrefix(p *packing.Plan, g int) (int64, error) {
	if p == nil {
		return 0, fmt.Errorf("msg: send prefix: nil plan: %w", distbuf.ErrInvalid)
	}
	groups := p.Groups()
	if g < 0 || g >= len(groups) {
		return 0, fmt.Errorf("msg: send prefix: group %d of %d: %w", g, len(groups), distbuf.ErrInvalid)
	}
	align := max(p.Options().Align, 16)
	pre := int64(wire.PayloadOffset(groups[g].Blocks))
	return (pre + align - 1) / align * align, nil
}

// AllocSend allocates the send buffers of plan p, one per destination
// group in the order of p.Groups, each with room for its manifest before
// the blocks (packing.AllocOptions.Prefix): the buffer holding the blocks is then
// the whole message, and sending it copies nothing. Fill the views in the
// order of s (or declare the work with Read/Write), then pass the buffers
// to Exchange. They stay the caller's: free them, or refill them for the
// next exchange. JoinSend lays the same send buffers out in one
// allocation, for a computation that fills every destination at once.
func AllocSend(a *devalloc.Allocator, p *packing.Plan, s *devalloc.Stream) ([]*packing.Coalesced, error) {
	if a == nil || p == nil {
		return nil, fmt.Errorf("msg: alloc send: nil allocator or plan: %w", distbuf.ErrInvalid)
	}
	out := make([]*packing.Coalesced, 0, len(p.Groups()))
	for g := range p.Groups() {
		pre, err := SendPrefix(p, g)
		if err == nil {
			var c *packing.Coalesced
			if c, err = packing.Alloc(a, p, s, packing.AllocOptions{Group: g, Prefix: pre}); err == nil {
				out = append(out, c)
				continue
			}
		}
		for _, c := range out {
			_ = c.Free()
		}
		return nil, fmt.Errorf("msg: alloc send: %w", err)
	}
	return out, nil
}

// JoinSend lays every send buffer of plan p out in one buffer
// (packing.Plan.Joined), each group after the room AllocSend reserves for
// its manifest (SendPrefix). Make it once per layout; then for each
// exchange allocate it (packing.Alloc: one allocator call and one padding
// clear for every destination), fill it, for instance by one GEMM plan
// whose C is the joined buffer and whose C indices are p's plan indices,
// and pass its Parts (the send buffers, in the order of p.Groups) to
// Exchange. The joined buffer stays the caller's: free it, not its parts,
// once Exchange has returned.
func JoinSend(p *packing.Plan) (*packing.Plan, error) {
	if p == nil {
		return nil, fmt.Errorf("msg: join send: nil plan: %w", distbuf.ErrInvalid)
	}
	var err error
	j, jerr := p.Joined(func(g int) int64 {
		pre, perr := SendPrefix(p, g)
		if perr != nil {
			err = perr
		}
		return pre
	})
	if err = errors.Join(err, jerr); err != nil {
		return nil, fmt.Errorf("msg: join send: %w", err)
	}
	return j, nil
}
