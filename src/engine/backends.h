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
};

// Throws bonsai::Error listing the known names for an unknown one.
std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& opt = {});
const std::vector<std::string>& backend_names();

}  // namespace bonsai
