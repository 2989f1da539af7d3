// Model profile JSON loading (workload/profile): any text must either give a profile whose layers and tensors are
// consistent or throw InvalidArgument naming the culprit; never crash, never another exception type.
#include <string>

#include "workload/profile.h"
#include "base/types.h"
#include "tests/fuzz/fuzz_target.h"

using namespace commsched;

int fuzz_profile_json(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const sim::ModelProfile p = sim::parse_profile(text, "fuzz input");
    size_t in_layers = 0;
    for (const auto& l : p.layers) {
      for (size_t t : l.tensors) FUZZ_CHECK(t < p.tensors.size());
      in_layers += l.tensors.size();
    }
    FUZZ_CHECK(in_layers == p.tensors.size());
  } catch (const InvalidArgument&) {
  }
  return 0;
}

COMMSCHED_FUZZ_TARGET(fuzz_profile_json)
