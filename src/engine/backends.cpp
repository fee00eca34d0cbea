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
      cpu::TernaryActivation act;
      if (!cpu::parse_ternary_activation(opt.activations.c_str(), act))
        fail("--act '{}' is not an activation precision of the cpu backend: f32, q8, q16 or q24", opt.activations);
      cpu::set_ternary_activation(act);
    }
    CpuBackend::Options o;
    o.threads = opt.threads;
    o.release_owned = opt.exclusive_model;
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
