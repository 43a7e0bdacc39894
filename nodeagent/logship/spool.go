package logship

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
)

// segmentInfo describes a sealed batch: its span of timestamps and its event count, so
// the age rule can often be applied without decoding it.
type segmentInfo struct {
	minTS, maxTS int64 // unix nanoseconds
	count        int
}

type segment struct {
	segmentInfo
	seq  uint64
	size int64
	data []byte // memory spool only
}

// spool holds sealed batches, oldest first, until they are delivered: in a directory
// (one file per batch, named by sequence, time span and count, written by rename so a
// crash never leaves half a batch), or in memory. It is bounded: a batch that does not
// fit evicts the oldest ones, whose events are counted as dropped.
type spool struct {
	dir    string
	max    int64
	onDrop func(events int)

	mu   sync.Mutex
	segs []*segment
	// busy is the segment being pushed; eviction passes it over, so its events are
	// counted as sent or dropped, never both.
	busy   *segment
	total  int64
	seq    uint64
	notify chan struct{}
}

const segSuffix = ".seg"

func openSpool(dir string, maxBytes int64, onDrop func(int)) (*spool, error) {
	sp := &spool{dir: dir, max: maxBytes, onDrop: onDrop, notify: make(chan struct{}, 1)}
	if dir == "" {
		return sp, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("logship: spool: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("logship: spool: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasSuffix(name, ".tmp") {
			_ = os.Remove(filepath.Join(dir, name)) // a write the last run did not finish
			continue
		}
		seg, ok := parseSegName(name)
		if !ok {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		seg.size = info.Size()
		sp.segs = append(sp.segs, seg)
		sp.total += seg.size
		sp.seq = max(sp.seq, seg.seq)
	}
	sort.Slice(sp.segs, func(i, j int) bool { return sp.segs[i].seq < sp.segs[j].seq })
	if len(sp.segs) > 0 {
		sp.signal()
	}
	return sp, nil
}

func segName(seg *segment) string {
	return fmt.Sprintf("%016x-%016x-%016x-%08x%s", seg.seq, uint64(seg.minTS), uint64(seg.maxTS), seg.count, segSuffix)
}

func parseSegName(name string) (*segment, bool) {
	if !strings.HasSuffix(name, segSuffix) {
		return nil, false
	}
	var seq, minTS, maxTS uint64
	var count int
	if n, err := fmt.Sscanf(strings.TrimSuffix(name, segSuffix), "%016x-%016x-%016x-%08x", &seq, &minTS, &maxTS, &count); err != nil || n != 4 {
		return nil, false
	}
	return &segment{seq: seq, segmentInfo: segmentInfo{minTS: int64(minTS), maxTS: int64(maxTS), count: count}}, true
}

func (sp *spool) signal() {
	select {
	case sp.notify <- struct{}{}:
	default:
	}
}

// put stores a sealed batch as the newest segment.
func (sp *spool) put(info segmentInfo, data []byte) error {
	size := int64(len(data))
	if size > sp.max {
		return errors.New("batch larger than the spool")
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	for sp.total+size > sp.max {
		var old *segment
		for _, s := range sp.segs {
			if s != sp.busy {
				old = s
				break
			}
		}
		if old == nil {
			break // only the batch in flight is left; the bound is exceeded by at most it
		}
		sp.removeLocked(old)
		sp.onDrop(old.count)
	}
	sp.seq++
	seg := &segment{segmentInfo: info, seq: sp.seq, size: size}
	if sp.dir == "" {
		seg.data = data
	} else if err := sp.write(seg, data); err != nil {
		return err
	}
	sp.segs = append(sp.segs, seg)
	sp.total += size
	sp.signal()
	return nil
}

func (sp *spool) write(seg *segment, data []byte) error {
	final := filepath.Join(sp.dir, segName(seg))
	tmp := final + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, final)
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}

// oldest returns the oldest segment and its bytes, or nil when the spool is empty, and
// marks it busy until remove or release.
func (sp *spool) oldest() (*segment, []byte, error) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	for len(sp.segs) > 0 {
		seg := sp.segs[0]
		if sp.dir == "" {
			sp.busy = seg
			return seg, seg.data, nil
		}
		data, err := os.ReadFile(filepath.Join(sp.dir, segName(seg)))
		if err != nil {
			// Unreadable (removed under us, disk trouble): it cannot be sent, so it goes.
			sp.removeLocked(seg)
			sp.onDrop(seg.count)
			continue
		}
		sp.busy = seg
		return seg, data, nil
	}
	return nil, nil, nil
}

// release ends the busy mark of a segment that stays (its push is to be retried).
func (sp *spool) release() {
	sp.mu.Lock()
	sp.busy = nil
	sp.mu.Unlock()
}

// remove forgets a segment (delivered, refused, or all too old).
func (sp *spool) remove(seg *segment) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.removeLocked(seg)
}

func (sp *spool) removeLocked(seg *segment) {
	if sp.busy == seg {
		sp.busy = nil
	}
	for i, s := range sp.segs {
		if s == seg {
			sp.segs = append(sp.segs[:i], sp.segs[i+1:]...)
			sp.total -= seg.size
			if sp.dir != "" {
				_ = os.Remove(filepath.Join(sp.dir, segName(seg)))
			}
			return
		}
	}
}

// replace swaps a segment's contents for a filtered version of it (same place in line),
// so events dropped for age are counted once however often the push is retried.
func (sp *spool) replace(seg *segment, info segmentInfo, data []byte) (*segment, error) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	i := -1
	for j, s := range sp.segs {
		if s == seg {
			i = j
		}
	}
	if i < 0 {
		return seg, nil // evicted meanwhile
	}
	next := &segment{segmentInfo: info, seq: seg.seq, size: int64(len(data))}
	if sp.dir == "" {
		next.data = data
	} else {
		if err := sp.write(next, data); err != nil {
			return seg, err
		}
		if segName(next) != segName(seg) {
			_ = os.Remove(filepath.Join(sp.dir, segName(seg)))
		}
	}
	sp.segs[i] = next
	if sp.busy == seg {
		sp.busy = next
	}
	sp.total += next.size - seg.size
	return next, nil
}

// len is the number of segments waiting (tests).
func (sp *spool) len() int {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return len(sp.segs)
}
