// Machine probes for performance accounting (`bonsai bench --probe`, bench/cpu_kernels.cpp): what this
// machine can do at best, so kernel and model speeds can be printed as a fraction of it.
#pragma once

namespace bonsai::cpu {

// Streaming read bandwidth in GB/s (1e9 bytes/s): `threads` threads (<= 0: hardware_concurrency) each
// read their contiguous slice of one 512 MiB buffer with the widest vector loads the CPU has; the best
// of 10 passes. Takes ~1 s.
double probe_read_bandwidth_gbs(int threads);

// Peak int8 dot-product throughput in G ops/s (one multiply-add = 2 ops) of the instruction the active
// kernel variant uses (vpdpbusd for avx512vnni, vpmaddubsw + vpmaddwd for avx512bw / avx2, scalar
// multiply-adds for portable), register-resident, `threads` threads. Takes ~0.5 s.
double probe_int8_dot_peak_gops(int threads);

}  // namespace bonsai::cpu
