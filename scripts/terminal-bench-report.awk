#!/usr/bin/awk -f
# Reads `go test -bench BenchmarkTerminal` output and prints each path's echo p50/p99 and
# the p99 it adds over the pty-direct baseline of the same run (goal: <= 1 ms idle,
# <= 2 ms under a bulk transfer on the same tunnel), and output throughput ratios.
/^Benchmark/ {
	name = $1; sub(/-[0-9]+$/, "", name); sub(/^BenchmarkTerminal/, "", name)
	p50 = ""; p99 = ""; mbs = ""
	for (i = 2; i <= NF; i++) {
		if ($i == "p50-µs") p50 = $(i-1)
		if ($i == "p99-µs") p99 = $(i-1)
		if ($i == "MB/s") mbs = $(i-1)
	}
	if (p99 != "") {
		if (name ~ /pty-direct/) base99 = p99
		n++; names[n] = name; p50s[n] = p50; p99s[n] = p99
	}
	if (mbs != "") {
		if (name ~ /pty-direct/) basemb = mbs
		m++; tn[m] = name; tm[m] = mbs
	}
}
END {
	for (i = 1; i <= n; i++) {
		goal = (names[i] ~ /bulk/) ? 2000 : 1000
		added = p99s[i] - base99
		verdict = (names[i] ~ /pty-direct/) ? "baseline" : (added <= goal ? "meets" : "misses")
		printf "  %-32s echo p50 %7.0f µs  p99 %7.0f µs  added p99 %7.0f µs  (goal <= %d µs: %s)\n", names[i], p50s[i], p99s[i], added, goal, verdict
	}
	for (i = 1; i <= m; i++) {
		printf "  %-32s output %7.1f MB/s  = %.2fx pty-direct\n", tn[i], tm[i], (basemb > 0 ? tm[i] / basemb : 0)
	}
}
