// Choosing a backend by name (the --backend option): "ref" (fp64 reference, slow), "cpu" (fp32, threaded)
// or "cuda" (the H200 backend; builds with CUDA only).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace bonsai {

struct BackendOptions {
  int threads = 0;  // cpu: threads of the op pool (<= 0: all hardware threads)
  int device = 0;   // cuda: device index
  // --act: the activation precision of the ternary products. "" = the backend's default (cpu: q16 on the
  // SIMD kernels; cuda: q16). cpu: f32 | q8 | q16 | q24 (process-wide: cpu::set_ternary_activation);
  // cuda: q8 | q16 | f16 | exact. q8 is the fast form with the looser stated bound (it fails the fixture gate's
  // 100% rule: ~95% argmax agreement; `bonsai gate --min-agreement 0.95 --max-delta 0.6 --max-kl 4e-3`, README
  // "Parity"); f16 runs the GEMM products (prefill chunks; a batched step's gate+up) on
  // fp16 activations (passes the gate's argmax agreement, looser max |dlogit| / KL than q16); ref ignores it (fp64).
  std::string activations;
  // The backend is the model's only user (the commands: run, chat, bench, gate): cpu releases each transcoded
  // (owned) canonical buffer once its tiles are built (CpuBackend::Options::release_owned), so a PTQ1_0 / MLX pack
  // holds ~1x the weights instead of 2x.
  bool exclusive_model = false;
};

// Throws bonsai::Error listing the known names for an unknown one.
std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& opt = {});
const std::vector<std::string>& backend_names();

}  // namespace bonsai
