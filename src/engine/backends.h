// Choosing a backend by name (the --backend option): "ref" (fp64 reference, slow) or "cpu" (fp32, threaded).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace bonsai {

struct BackendOptions {
  int threads = 0;  // cpu: threads of the op pool (<= 0: all hardware threads)
};

// Throws bonsai::Error listing the known names for an unknown one.
std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& opt = {});
const std::vector<std::string>& backend_names();

}  // namespace bonsai
