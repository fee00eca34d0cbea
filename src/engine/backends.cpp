#include "engine/backends.h"

#include "backend/cpu/cpu_backend.h"
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
    CpuBackend::Options o;
    o.threads = opt.threads;
    return std::make_unique<CpuBackend>(o);
  }
  if (name == "cuda") {
#ifdef BONSAI_HAVE_CUDA
    return make_cuda_backend(opt.device);  // throws a clear Error without a GPU / with too little memory
#else
    fail("backend 'cuda': this bonsai was built without CUDA (configure where nvcc is installed, -DBONSAI_CUDA=ON)");
#endif
  }
  fail("unknown backend '{}': known backends are 'ref', 'cpu' and 'cuda'", name);
}

}  // namespace bonsai
