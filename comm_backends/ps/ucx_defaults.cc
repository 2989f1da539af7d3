#include "comm_backends/ps/ucx_defaults.h"

#include <algorithm>
#include <functional>
#include <set>
#include <string>
#include <string_view>

namespace commsched::ps {

bool ucx_shared_memory_only(const char* tls) {
  if (!tls || !*tls || *tls == '^') return false;
  static const std::set<std::string, std::less<>> kShm = {"sm",    "shm",  "mm",  "posix", "sysv",
                                                          "xpmem", "knem", "cma", "self"};
  for (std::string_view rest = tls;;) {
    const size_t comma = std::min(rest.find(','), rest.size());
    if (!kShm.contains(rest.substr(0, comma))) return false;
    if (comma == rest.size()) return true;
    rest.remove_prefix(comma + 1);
  }
}

}  // namespace commsched::ps
