package e2e_test

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// patternReader yields n bytes of a fixed pattern, so 1 GiB never sits in memory.
type patternReader struct{ left int64 }

func (p *patternReader) Read(b []byte) (int, error) {
	if p.left <= 0 {
		return 0, io.EOF
	}
	n := min(int64(len(b)), p.left)
	for i := range b[:n] {
		b[i] = byte('a' + (p.left-int64(i))%26)
	}
	p.left -= n
	return int(n), nil
}

func transportName() string {
	if t := os.Getenv("GANTRY_BENCH_FABRIC_TRANSPORT"); t != "" {
		return t
	}
	return "auto"
}

// BenchmarkStorageAttachmentRead is issue 20's attachment benchmark (`make bench`): one
// 1 GiB object read inside a real allocation through a ro attachment (`cat file >
// /dev/null` in a shell of the allocation, timed there) against an API GET of the same
// object in the same run, on the same control plane. The method is the agent's auto
// choice (FUSE where /dev/fuse works, else copy-in, whose attach then carries the
// transfer: its time from POST to attached is reported too). It prints the throughputs
// and their ratio (goal: attachment >= 0.5x the API); nothing is asserted on timing.
//
// GANTRY_BENCH_STORAGE_BYTES shrinks the object while iterating;
// GANTRY_BENCH_ATTACH_CPUPROFILE=<file> profiles this process (control plane and agent
// both run in it) while the allocation reads the file.
func BenchmarkStorageAttachmentRead(b *testing.B) {
	size := int64(1 << 30)
	if v, err := strconv.ParseInt(os.Getenv("GANTRY_BENCH_STORAGE_BYTES"), 10, 64); err == nil && v > 0 {
		size = v
	}
	for i := 0; i < b.N; i++ {
		benchAttachmentRead(b, size)
	}
}

func benchAttachmentRead(b *testing.B, size int64) {
	mode := "fuse"
	if ok, why := fuseUsable(); !ok {
		b.Logf("%s: copy mode", why)
		mode = "copy"
	}
	if m := os.Getenv("GANTRY_BENCH_STORAGE_MODE"); m == "fuse" || m == "copy" {
		mode = m // copy: the attach itself carries the transfer (one Read stream per object)
	}
	// The agent's fabric transport: auto (QUIC) unless GANTRY_BENCH_FABRIC_TRANSPORT says.
	w := newStorageWorld(b, mode, os.Getenv("GANTRY_BENCH_FABRIC_TRANSPORT"))
	w.shellLimit = 10 * time.Minute

	req, _ := http.NewRequest(http.MethodPut, w.c.url+"/api/v1/storage/buckets/data/object?path="+url.QueryEscape("big.bin"), &patternReader{left: size})
	req.ContentLength = size
	req.Header.Set("Authorization", "Bearer "+w.token)
	req.Header.Set("X-Project-ID", w.project.String())
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 201 && res.StatusCode != 200 {
		b.Fatalf("put 1 GiB: %d %s", res.StatusCode, body)
	}

	start := time.Now()
	a := w.attach(b, "ro", "")
	w.waitState(b, a.AttachmentID, "attached")
	attachTime := time.Since(start)

	// Attachment: timed inside the allocation, so the terminal stream's setup is not in it.
	stopProfile := startCPUProfile(b, os.Getenv("GANTRY_BENCH_ATTACH_CPUPROFILE"))
	cpu0, mach0 := processCPU(), machineCPU()
	bulk0 := w.c.app.Fabric.BulkStreams()
	// times: the shell's children (the cat: its read syscalls, with the kernel's FUSE
	// copies in them) on the second line.
	out, code := w.shell(b, `s=$(date +%s%N); cat "$HOME/buckets/data/big.bin" > /dev/null || exit 7; e=$(date +%s%N); echo "ns=$((e-s))"; echo "times:"; times`)
	var ns int64
	if i := strings.Index(out, "ns="); code != 0 || i < 0 {
		b.Fatalf("reading through the attachment: exit %d %q", code, out)
	} else if _, err := fmt.Sscanf(out[i:], "ns=%d", &ns); err != nil || ns <= 0 {
		b.Fatalf("reading through the attachment: %q", out)
	}
	attachCPU, attachMach := processCPU()-cpu0, machineCPU()-mach0
	bulkStreams := w.c.app.Fabric.BulkStreams() - bulk0
	catCPU := childTimes(out)
	stopProfile()
	attachRead := time.Duration(ns)

	// API GET of the same object, same run.
	cpu0, mach0 = processCPU(), machineCPU()
	start = time.Now()
	req, _ = http.NewRequest(http.MethodGet, w.c.url+"/api/v1/storage/buckets/data/object?path=big.bin", nil)
	req.Header.Set("Authorization", "Bearer "+w.token)
	req.Header.Set("X-Project-ID", w.project.String())
	res, err = http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	n, err := io.Copy(io.Discard, res.Body)
	res.Body.Close()
	apiRead := time.Since(start)
	apiCPU, apiMach := processCPU()-cpu0, machineCPU()-mach0
	if err != nil || n != size {
		b.Fatalf("API GET read %d bytes: %v", n, err)
	}
	mib := float64(size) / (1 << 20)
	attachRate, apiRate := mib/attachRead.Seconds(), mib/apiRead.Seconds()
	fmt.Printf("storage attachment (%s, fabric %s): read %d MiB in %s (%.0f MiB/s) vs API GET %s (%.0f MiB/s): ratio %.2fx (goal >= 0.5x); attach took %s\n",
		mode, transportName(), size>>20, attachRead.Round(time.Millisecond), attachRate, apiRead.Round(time.Millisecond), apiRate, attachRate/apiRate, attachTime.Round(time.Millisecond))
	// Which path the bytes took: raw reads move to bulk connections (or, from a control
	// plane without them, a QUIC tunnel's to a bulk side session) once the first is up
	// (docs/fabric.md).
	fmt.Printf("  raw read streams served on bulk connections or side sessions during the read: %d\n", bulkStreams)
	// What each path costs, whatever else the machine runs: CPU seconds per GiB of this
	// process (control plane, agent and the GET's client; the allocation's cat is a
	// child process and not counted), with the load average beside it.
	gib := float64(size) / (1 << 30)
	fmt.Printf("  CPU of this process per GiB: attachment %.2f s, API GET %.2f s (load average %s)\n",
		attachCPU.Seconds()/gib, apiCPU.Seconds()/gib, loadAverage())
	// The reader's side: the cat's CPU (its read(2) calls carry the kernel's FUSE copy)
	// for the attachment; the GET's client is in this process already.
	attachPath := attachCPU + catCPU
	fmt.Printf("  CPU per GiB with the reader: attachment %.2f s (cat %.2f s), API GET %.2f s\n",
		attachPath.Seconds()/gib, catCPU.Seconds()/gib, apiCPU.Seconds()/gib)
	// The whole machine's busy CPU over each read (every process, other work on a shared
	// machine included: under load it only bounds the path's cost from above).
	fmt.Printf("  whole machine busy CPU per GiB while reading: attachment %.2f s, API GET %.2f s\n",
		attachMach.Seconds()/gib, apiMach.Seconds()/gib)
	// What the CPU cost alone allows: a path that needs c CPU seconds per GiB cannot go
	// faster than cores/c GiB/s, and with both paths CPU-bound on the same cores the ratio
	// cannot exceed the inverse ratio of their costs.
	cores := float64(runtime.NumCPU())
	if attachPath > 0 && apiCPU > 0 {
		fmt.Printf("  CPU bound on %d cores: attachment <= %.0f MiB/s, API GET <= %.0f MiB/s, ratio <= %.2fx\n",
			runtime.NumCPU(), cores*1024/(attachPath.Seconds()/gib), cores*1024/(apiCPU.Seconds()/gib), apiCPU.Seconds()/attachPath.Seconds())
	}
	b.ReportMetric(attachRate/apiRate, "ratio")
}

// processCPU is this process's user + system CPU so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// machineCPU is the busy CPU time of the whole machine so far (/proc/stat: every
// state but idle and iowait, over all CPUs).
func machineCPU() time.Duration {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0
	}
	var busy int64
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i == 3 || i == 4 || i >= 7 { // idle, iowait; guest times are in user already
			continue
		}
		busy += n
	}
	return time.Duration(busy) * time.Second / 100 // USER_HZ
}

// childTimes parses the second line after "times:" in a shell's output (the POSIX
// times builtin: the children's user and system time, as "0m1.230s 0m0.450s").
func childTimes(out string) time.Duration {
	_, rest, ok := strings.Cut(out, "times:")
	if !ok {
		return 0
	}
	lines := strings.Fields(rest)
	if len(lines) < 4 {
		return 0
	}
	var total time.Duration
	for _, v := range lines[2:4] {
		var m int
		var sec float64
		if _, err := fmt.Sscanf(v, "%dm%fs", &m, &sec); err == nil {
			total += time.Duration(float64(m)*float64(time.Minute) + sec*float64(time.Second))
		}
	}
	return total
}

func loadAverage() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(raw)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}

// startCPUProfile profiles this process into path until the returned func runs (a
// no-op without a path).
func startCPUProfile(b *testing.B, path string) func() {
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	return func() { pprof.StopCPUProfile(); _ = f.Close() }
}
