#include "comm_backends/ps/ucx_defaults.h"

#include <algorithm>
#include <cstdlib>
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

std::vector<UcxSetting> ucx_default_settings(const char* tls, bool sender_writes) {
  std::vector<UcxSetting> out;
  if (!ucx_shared_memory_only(tls)) return out;
  out.push_back({"RNDV_THRESH", kUcxShmRendezvousFrom});
  if (sender_writes) out.push_back({"RNDV_SCHEME", "put_zcopy"});
  std::erase_if(out, [](const UcxSetting& s) { return std::getenv(("UCX_" + s.name).c_str()) != nullptr; });
  return out;
}

}  // namespace commsched::ps
