// libFuzzer target: SafetensorsFile on arbitrary bytes. A malformed input must end in bonsai::Error;
// anything else (a crash, a sanitizer report, a nlohmann exception escaping, a hang) is a bug.
#include <cstddef>
#include <cstdint>

#include "format/safetensors.h"
#include "util/error.h"

using namespace bonsai;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<SafetensorsFile> file;
  try {
    file = std::make_unique<SafetensorsFile>(data, size, "fuzz.safetensors");
  } catch (const Error&) {
    return 0;
  }

  volatile uint8_t sink = 0;
  const uint8_t* prev_end = nullptr;
  for (const auto& t : file->tensors()) {
    if (t.nbytes) {
      sink = sink + t.data[0] + t.data[t.nbytes - 1];  // inside the input (ASan checks)
      if (prev_end && t.data < prev_end) __builtin_trap();  // sorted, no overlap
      prev_end = t.data + t.nbytes;
    }
    if (t.nbytes != t.elements() * st_dtype_size(t.dtype)) __builtin_trap();
    if (file->find(t.name) != &t) __builtin_trap();
  }

  // Not caught: the writer refusing what the reader accepted is a bug.
  SafetensorsWriter w;
  for (const auto& [k, v] : file->metadata()) w.set_metadata(k, v);
  for (const auto& t : file->tensors()) w.add(t.name, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes));
  return 0;
}
