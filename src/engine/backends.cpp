#include "engine/backends.h"

#include "backend/cpu/cpu_backend.h"
#include "backend/ref/ref_backend.h"
#include "util/error.h"

namespace bonsai {

const std::vector<std::string>& backend_names() {
  static const std::vector<std::string> names{"ref", "cpu"};
  return names;
}

std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& opt) {
  if (name == "ref") return std::make_unique<RefBackend>();
  if (name == "cpu") {
    CpuBackend::Options o;
    o.threads = opt.threads;
    return std::make_unique<CpuBackend>(o);
  }
  fail("unknown backend '{}': known backends are 'ref' and 'cpu'", name);
}

}  // namespace bonsai
