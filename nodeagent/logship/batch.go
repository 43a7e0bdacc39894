package logship

import (
	"context"
	"time"

	"github.com/grafana/loki/pkg/push"
	"github.com/klauspost/compress/snappy"
)

// batcher gathers events into one push request, stream by stream.
type batcher struct {
	streams map[string]int // labels -> index in req.Streams
	req     push.PushRequest
	bytes   int
	count   int
	minTS   int64
	maxTS   int64
}

func newBatcher() *batcher { return &batcher{streams: map[string]int{}} }

func (b *batcher) add(ev event) {
	i, ok := b.streams[ev.stream]
	if !ok {
		i = len(b.req.Streams)
		b.streams[ev.stream] = i
		b.req.Streams = append(b.req.Streams, push.Stream{Labels: ev.stream})
	}
	b.req.Streams[i].Entries = append(b.req.Streams[i].Entries, push.Entry{Timestamp: ev.ts, Line: ev.line, StructuredMetadata: ev.meta})
	ts := ev.ts.UnixNano()
	if b.count == 0 || ts < b.minTS {
		b.minTS = ts
	}
	if b.count == 0 || ts > b.maxTS {
		b.maxTS = ts
	}
	b.count++
	b.bytes += int(ev.size)
}

// seal encodes the batch (protobuf in a snappy block) and resets the batcher.
func (b *batcher) seal() (segmentInfo, []byte) {
	raw, err := b.req.Marshal()
	if err != nil {
		panic(err) // a PushRequest of valid strings always marshals
	}
	info := segmentInfo{minTS: b.minTS, maxTS: b.maxTS, count: b.count}
	*b = batcher{streams: map[string]int{}}
	return info, snappy.Encode(nil, raw)
}

// batch moves events from the queue into batches and seals each into the spool when it
// reaches BatchBytes or BatchWait after its first line. On ctx's end it seals whatever is
// queued, so nothing added before Run returned is left behind.
func (s *Shipper) batch(ctx context.Context) {
	b := newBatcher()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	seal := func() {
		timer.Stop()
		if b.count == 0 {
			return
		}
		info, data := b.seal()
		if err := s.spool.put(info, data); err != nil {
			s.cfg.Logger.Warn("log spool write failed; batch dropped", "error", err, "events", info.count)
			s.stats.droppedSpool.Add(int64(info.count))
		}
	}
	take := func(ev event) {
		s.queued.Add(-ev.size)
		if b.count == 0 {
			timer.Reset(s.cfg.BatchWait)
		}
		b.add(ev)
		if b.bytes >= s.cfg.BatchBytes {
			seal()
		}
	}
	for {
		select {
		case ev := <-s.queue:
			take(ev)
		case <-timer.C:
			seal()
		case <-ctx.Done():
			for {
				select {
				case ev := <-s.queue:
					take(ev)
				default:
					seal()
					return
				}
			}
		}
	}
}
