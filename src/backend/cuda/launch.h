// One kernel launch as data: the function, its grid, and its single by-value argument struct as bytes.
//
// Why a record instead of a direct <<<>>> launch: the backend either launches it at once (eager) or
// appends it to a decode step that becomes ONE CUDA graph (cuda_backend.cpp). Replaying the step with new
// positions / token ids only compares each record's argument bytes with the graph node's and patches the
// nodes that differ (cudaGraphExecKernelNodeSetParams), so the forward, written against the Backend
// interface, runs unchanged while the GPU sees one graph launch per token.
//
// Every kernel of this backend takes exactly one parameter, a POD struct with no padding holes (pointers
// first, then 64-bit, then 32-bit fields, explicitly padded), so equal arguments mean equal bytes.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace bonsai::cuda {

constexpr unsigned kLaunchArgBytes = 2048;  // batched-decode row tables ride inline (kernels.h); CUDA allows 4 KB

struct Launch {
  const void* func = nullptr;  // the __global__ function
  dim3 grid{1, 1, 1}, block{1, 1, 1};
  uint32_t smem = 0;           // dynamic shared memory bytes
  uint32_t size = 0;           // bytes of args in use
  bool serial_in = false;      // no programmatic edge into this launch: it starts once its predecessor has completed
  alignas(16) unsigned char args[kLaunchArgBytes];

  bool same_shape(const Launch& o) const {
    return func == o.func && grid.x == o.grid.x && grid.y == o.grid.y && grid.z == o.grid.z &&
           block.x == o.block.x && block.y == o.block.y && block.z == o.block.z && smem == o.smem && size == o.size &&
           serial_in == o.serial_in;
  }
  bool same_args(const Launch& o) const { return size == o.size && std::memcmp(args, o.args, size) == 0; }
};

template <class A>
Launch make_launch(const void* func, dim3 grid, dim3 block, uint32_t smem, const A& a) {
  static_assert(std::is_trivially_copyable_v<A> && sizeof(A) <= kLaunchArgBytes);
  Launch l;
  l.func = func;
  l.grid = grid;
  l.block = block;
  l.smem = smem;
  l.size = uint32_t(sizeof(A));
  std::memcpy(l.args, &a, sizeof(A));  // only the first `size` bytes are ever compared or launched
  return l;
}

// Sets field `f` of l's argument (of type A, which l must carry) to v: the diagnostics point a built launch at their
// trace buffer this way.
template <class A, class T>
void set_arg_field(Launch& l, T A::*f, T v) {
  static_assert(std::is_trivially_copyable_v<A> && sizeof(A) <= kLaunchArgBytes);
  A a;
  std::memcpy(&a, l.args, sizeof a);
  a.*f = v;
  std::memcpy(l.args, &a, sizeof a);
}

inline int64_t launch_blocks(const Launch& l) { return int64_t(l.grid.x) * l.grid.y * l.grid.z; }

}  // namespace bonsai::cuda
