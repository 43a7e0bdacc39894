package logship

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/grafana/loki/pkg/push"
	"github.com/klauspost/compress/snappy"
)

type verdict int

const (
	delivered verdict = iota
	rejected          // refused for good (400, 413): retrying cannot help
	retry             // try again later
)

type result struct {
	verdict    verdict
	status     int
	retryAfter time.Duration
	err        error
}

// send pushes the spool's oldest batch, over and over, until ctx ends.
func (s *Shipper) send(ctx context.Context) {
	backoff := s.cfg.MinBackoff
	for ctx.Err() == nil {
		seg, data, err := s.spool.oldest()
		if err != nil || seg == nil {
			select {
			case <-s.spool.notify:
			case <-ctx.Done():
			}
			continue
		}
		seg, data, ok := s.applyAge(seg, data)
		if !ok {
			continue
		}
		res := s.post(ctx, data)
		switch res.verdict {
		case delivered:
			s.spool.remove(seg)
			s.stats.sent.Add(int64(seg.count))
			s.stats.sentBatches.Add(1)
			backoff = s.cfg.MinBackoff
		case rejected:
			s.spool.remove(seg)
			s.stats.droppedRejected.Add(int64(seg.count))
			s.cfg.Logger.Warn("log gateway refused a batch for good; dropped", "status", res.status, "events", seg.count)
		case retry:
			s.spool.release()
			if ctx.Err() != nil {
				return
			}
			s.stats.retries.Add(1)
			wait := res.retryAfter
			if wait <= 0 {
				wait = jitter(backoff)
				backoff = min(2*backoff, s.cfg.MaxBackoff)
			}
			// Past MaxAge the batch would be dropped anyway: never wait longer.
			wait = min(wait, s.cfg.MaxAge)
			s.cfg.Logger.Debug("log push failed; retrying", "status", res.status, "error", res.err, "wait", wait)
			if s.cfg.Sleep(ctx, wait) != nil {
				return
			}
		}
	}
}

// drain makes one pass over the spool without retries (shutdown).
func (s *Shipper) drain(ctx context.Context) {
	for ctx.Err() == nil {
		seg, data, err := s.spool.oldest()
		if err != nil || seg == nil {
			return
		}
		seg, data, ok := s.applyAge(seg, data)
		if !ok {
			continue
		}
		res := s.post(ctx, data)
		switch res.verdict {
		case delivered:
			s.spool.remove(seg)
			s.stats.sent.Add(int64(seg.count))
			s.stats.sentBatches.Add(1)
		case rejected:
			s.spool.remove(seg)
			s.stats.droppedRejected.Add(int64(seg.count))
		default:
			s.spool.release()
			return
		}
	}
}

// jitter spreads d by ±20% so a fleet that lost the gateway together does not come back
// in lockstep.
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// applyAge drops the events of seg older than MaxAge, counting them. It reports false
// when nothing is left to push (the segment is then gone from the spool).
func (s *Shipper) applyAge(seg *segment, data []byte) (*segment, []byte, bool) {
	cutoff := s.cfg.Clock.Now().Add(-s.cfg.MaxAge).UnixNano()
	if seg.minTS >= cutoff {
		return seg, data, true
	}
	if seg.maxTS < cutoff {
		s.spool.remove(seg)
		s.stats.droppedOld.Add(int64(seg.count))
		return nil, nil, false
	}
	info, filtered, dropped, err := filterOld(data, cutoff)
	if err != nil {
		// A segment we cannot read is one we cannot send.
		s.spool.remove(seg)
		s.stats.droppedSpool.Add(int64(seg.count))
		s.cfg.Logger.Warn("unreadable log batch in the spool; dropped", "error", err)
		return nil, nil, false
	}
	s.stats.droppedOld.Add(int64(dropped))
	if info.count == 0 {
		s.spool.remove(seg)
		return nil, nil, false
	}
	next, err := s.spool.replace(seg, info, filtered)
	if err != nil {
		s.cfg.Logger.Warn("log spool rewrite failed", "error", err)
	}
	return next, filtered, true
}

// filterOld re-encodes a batch without its entries older than cutoff.
func filterOld(data []byte, cutoff int64) (segmentInfo, []byte, int, error) {
	raw, err := snappy.Decode(nil, data)
	if err != nil {
		return segmentInfo{}, nil, 0, err
	}
	var req push.PushRequest
	if err := req.Unmarshal(raw); err != nil {
		return segmentInfo{}, nil, 0, err
	}
	var info segmentInfo
	dropped := 0
	streams := req.Streams[:0]
	for _, st := range req.Streams {
		kept := st.Entries[:0]
		for _, e := range st.Entries {
			ts := e.Timestamp.UnixNano()
			if ts < cutoff {
				dropped++
				continue
			}
			if info.count == 0 || ts < info.minTS {
				info.minTS = ts
			}
			if info.count == 0 || ts > info.maxTS {
				info.maxTS = ts
			}
			info.count++
			kept = append(kept, e)
		}
		if len(kept) > 0 {
			st.Entries = kept
			streams = append(streams, st)
		}
	}
	req.Streams = streams
	out, err := req.Marshal()
	if err != nil {
		return segmentInfo{}, nil, 0, err
	}
	return info, snappy.Encode(nil, out), dropped, nil
}

// post pushes one batch to the gateway.
func (s *Shipper) post(ctx context.Context, data []byte) result {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.PushTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.pushURL, bytes.NewReader(data))
	if err != nil {
		return result{verdict: rejected, err: err}
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("Authorization", "Bearer "+s.cfg.Token())
	resp, err := s.cfg.HTTPClient.Do(req)
	if err != nil {
		return result{verdict: retry, err: err}
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	res := result{status: resp.StatusCode}
	switch {
	case resp.StatusCode/100 == 2:
		res.verdict = delivered
	case resp.StatusCode == http.StatusBadRequest || resp.StatusCode == http.StatusRequestEntityTooLarge:
		res.verdict = rejected
	default:
		// 401 too: the agent may rotate its token, and the age rule bounds the wait.
		res.verdict = retry
		res.err = fmt.Errorf("gateway answered %d", resp.StatusCode)
		if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs > 0 {
			res.retryAfter = time.Duration(secs) * time.Second
		}
	}
	return res
}
