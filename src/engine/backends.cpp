#include "engine/backends.h"

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "backend/ref/ref_backend.h"
#include "util/error.h"
#ifdef BONSAI_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace bonsai {

const std::vector<std::string>& backend_names() {
  static const std::vector<std::string> names{"ref", "cpu", "cuda"};
  return names;
}

std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& opt) {
  if (name == "ref") return std::make_unique<RefBackend>();
  if (name == "cpu") {
    if (!opt.activations.empty()) {
      static const std::pair<const char*, cpu::TernaryActivation> kActs[] = {
          {"f32", cpu::TernaryActivation::f32}, {"q8", cpu::TernaryActivation::q8},
          {"q16", cpu::TernaryActivation::q16}, {"q24", cpu::TernaryActivation::q24}};
      bool found = false;
      for (const auto& [word, act] : kActs)
        if (opt.activations == word) {
          cpu::set_ternary_activation(act);
          found = true;
        }
      if (!found) fail("--act '{}' is not an activation precision of the cpu backend: f32, q8, q16 or q24", opt.activations);
    }
    CpuBackend::Options o;
    o.threads = opt.threads;
    return std::make_unique<CpuBackend>(o);
  }
  if (name == "cuda") {
#ifdef BONSAI_HAVE_CUDA
    // throws a clear Error without a GPU / with too little memory
    return make_cuda_backend(opt.device, opt.activations);
#else
    fail("backend 'cuda': this bonsai was built without CUDA (configure where nvcc is installed, -DBONSAI_CUDA=ON)");
#endif
  }
  fail("unknown backend '{}': known backends are 'ref', 'cpu' and 'cuda'", name);
}

}  // namespace bonsai
