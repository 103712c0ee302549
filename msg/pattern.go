package msg

// checkPattern compares this rank's messages with a learned pattern. A
// destination the pattern expects a message for gets one in any case: the
// message, or an abort notice when the message cannot be sent as expected.
func (p *Pattern) check(e *exchange, failed bool) {
	for d, m := range e.byDest {
		if failed {
			e.abortTo[d] = p.sendSize[d] > 0
			e.byDest[d] = nil
			continue
		}
		w := p.departure(d, m, e.x.o.Tag)
		if w == nil {
			continue
		}
		e.fail(w)
		switch w.Field {
		case "message_size": // the receiver expects a message of the learned size
			e.abortTo[d] = true
			e.byDest[d] = nil
		case "dest": // the receiver expects nothing
			e.byDest[d] = nil
		}
		// A different manifest of the right size is sent: the receiver
		// rejects it too.
	}
}

// departure says how m, this exchange's message for rank d (nil for none),
// departs from the pattern, or nil when it does not.
func (p *Pattern) departure(d int, m *outMsg, tag int) *WireError {
	want := p.sendSize[d]
	var w *WireError
	switch {
	case m == nil && want > 0:
		w = wireErr(ErrPatternMismatch, d, tag, "message_size", "the pattern expects %d bytes, this exchange has nothing for rank %d", want, d)
	case m == nil:
	case want == 0:
		w = wireErr(ErrPatternMismatch, d, tag, "dest", "rank %d expects no message in this pattern; nothing was sent", d)
	case m.size != want:
		w = wireErr(ErrPatternMismatch, d, tag, "message_size", "%d bytes, the pattern expects %d", m.size, want)
	case m.man != nil && (p.sendOut[d] == nil || !m.man.SameEntries(p.sendOut[d].Layout)):
		// (A message to self copied without a manifest is checked where it
		// is copied: copyToSelf.)
		w = wireErr(ErrPatternMismatch, d, tag, "manifest", "the blocks differ from the pattern's (same size)")
	}
	if w != nil {
		w.Outgoing = true
	}
	return w
}

// learn records the exchange e, which just succeeded, in the pattern.
func (p *Pattern) learn(e *exchange) {
	n := e.x.size
	p.sendSize, p.sendOut = make([]int64, n), make([]*outManifest, n)
	for d, m := range e.byDest {
		if m != nil {
			p.sendSize[d] = m.size
			if m.man != nil {
				p.sendOut[d] = m.man
			}
		}
	}
	p.recvSize = append([]int64(nil), e.recvSize...)
	p.recv = make([]*learnedIn, n)
	for _, in := range e.ins {
		p.recv[in.src] = in.learned
	}
	if e.selfIn != nil {
		p.recv[e.x.rank] = e.selfIn.learned
	}
	p.learned = true
}
