//go:build mpi

package mpibench

import (
	"time"

	"github.com/distbuf/distbuf/cluster"
)

// The Go loops mirror the C ones call for call, through cluster.
const (
	tagPingPong = 201
	tagRate     = 202
	tagAck      = 203
)

// PingPongGo is PingPongC through cluster.
func PingPongGo(w *cluster.Comm, send, recv cluster.Memory, iters int) (float64, error) {
	peer := 1 - w.Rank()
	start := time.Now()
	for range iters {
		rr, err := w.Irecv(recv, peer, tagPingPong)
		if err != nil {
			return 0, err
		}
		if w.Rank() == 0 {
			sr, err := w.Isend(send, peer, tagPingPong)
			if err != nil {
				return 0, err
			}
			if err := cluster.Waitall([]*cluster.Request{rr, sr}); err != nil {
				return 0, err
			}
			continue
		}
		if _, err := rr.Wait(); err != nil {
			return 0, err
		}
		sr, err := w.Isend(send, peer, tagPingPong)
		if err != nil {
			return 0, err
		}
		if _, err := sr.Wait(); err != nil {
			return 0, err
		}
	}
	return time.Since(start).Seconds(), nil
}

// MessageRateGo is MessageRateC through cluster; slots[k] is message k's
// part of the buffer.
func MessageRateGo(w *cluster.Comm, slots []cluster.Memory, ack cluster.Memory, iters int) (float64, error) {
	peer := 1 - w.Rank()
	reqs := make([]*cluster.Request, len(slots))
	start := time.Now()
	for range iters {
		for k, m := range slots {
			var err error
			if w.Rank() == 0 {
				reqs[k], err = w.Isend(m, peer, tagRate)
			} else {
				reqs[k], err = w.Irecv(m, peer, tagRate)
			}
			if err != nil {
				return 0, err
			}
		}
		if err := cluster.Waitall(reqs); err != nil {
			return 0, err
		}
		var r *cluster.Request
		var err error
		if w.Rank() == 0 {
			r, err = w.Irecv(ack, peer, tagAck)
		} else {
			r, err = w.Isend(ack, peer, tagAck)
		}
		if err != nil {
			return 0, err
		}
		if _, err := r.Wait(); err != nil {
			return 0, err
		}
	}
	return time.Since(start).Seconds(), nil
}
