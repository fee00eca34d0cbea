// The machine probes `bonsai bench` holds its numbers against (backend/cpu/probe.h): they must measure
// something real (a positive rate of a plausible size), whatever the load on the machine.
#include <gtest/gtest.h>

#include "backend/cpu/kernels.h"
#include "backend/cpu/probe.h"

namespace cpu = bonsai::cpu;

TEST(CpuProbe, ReadBandwidthAndInt8PeakArePlausible) {
  const double read = cpu::probe_read_bandwidth_gbs(1);
  // One thread streaming 512 MiB: more than a disk (0.5 GB/s), less than any L1 (2 TB/s).
  EXPECT_GT(read, 0.5);
  EXPECT_LT(read, 2000.0);
  const double peak = cpu::probe_int8_dot_peak_gops(1);
  EXPECT_GT(peak, 0.5) << cpu::kernels_name();
  EXPECT_LT(peak, 20000.0) << cpu::kernels_name();
}
