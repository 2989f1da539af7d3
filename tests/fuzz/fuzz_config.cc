// Size, rate, duration, integer and boolean parsing (options/parse) and the PS and engine options built on them:
// any text must either parse to a sane value or throw InvalidArgument naming the variable. Input: one selector byte,
// then the value text.
#include <cmath>
#include <string>
#include <string_view>
#include <vector>

#include "comm_backends/ps/ps_config.h"
#include "scheduler/config.h"
#include "base/types.h"
#include "tests/fuzz/fuzz_target.h"

using namespace commsched;

namespace {

// Every option of the registry's tables (the selector picks one).
const std::vector<std::string>& ps_options() {
  static const std::vector<std::string> names = ps_option_table().names();
  return names;
}
const std::vector<std::string>& engine_options() {
  static const std::vector<std::string> names = engine_option_table().names();
  return names;
}

void parse_one(uint8_t selector, std::string_view v) {
  const std::string_view var = "COMMSCHED_FUZZ";
  switch (selector % 8) {
    case 0: FUZZ_CHECK(parse_bytes(var, v) > 0); break;
    case 1: (void)parse_bytes(var, v, /*allow_unlimited=*/true); break;
    case 2: {
      const double r = parse_rate_bps(var, v, selector & 8);
      FUZZ_CHECK(std::isfinite(r) && r >= 0);
      break;
    }
    case 3: {
      const double s = parse_seconds(var, v);
      FUZZ_CHECK(std::isfinite(s));
      break;
    }
    case 4: {
      const int64_t i = parse_int(var, v, -1000, 1000);
      FUZZ_CHECK(i >= -1000 && i <= 1000);
      break;
    }
    case 5: (void)parse_bool(var, v); break;
    case 6: {
      PsConfig c;
      c.set(ps_options()[(selector >> 3) % ps_options().size()], v);
      break;
    }
    case 7: {
      EngineConfig c;
      c.set(engine_options()[(selector >> 3) % engine_options().size()], v);
      break;
    }
  }
}

}  // namespace

int fuzz_config(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    parse_one(data[0], text);
  } catch (const InvalidArgument&) {
  }
  return 0;
}

COMMSCHED_FUZZ_TARGET(fuzz_config)
