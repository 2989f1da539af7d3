#include "simulator/huge_pages.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace commsched {
namespace {

// Carries the user's GLIBC_TUNABLES across the restart ("" when it was unset: glibc reads both alike).
constexpr const char* kBefore = "COMMSCHED_TUNABLES_BEFORE_RESTART";

void put_back(const std::string& before) {
  if (before.empty()) ::unsetenv("GLIBC_TUNABLES");
  else ::setenv("GLIBC_TUNABLES", before.c_str(), 1);
  ::unsetenv(kBefore);
}

}  // namespace

std::optional<std::string> tunables_with_huge_pages(const char* current) {
  const std::string set = current ? current : "";
  if (set.find("glibc.malloc.hugetlb") != std::string::npos) return std::nullopt;
  return set + (set.empty() ? "" : ":") + "glibc.malloc.hugetlb=1";
}

void restart_with_huge_pages(char** argv) {
  if (const char* before = std::getenv(kBefore)) return put_back(before);  // this is the restarted process
  const char* current = std::getenv("GLIBC_TUNABLES");
  const std::optional<std::string> tunables = tunables_with_huge_pages(current);
  if (!tunables) return;
  std::error_code error;  // the executable's own path, so that the process keeps its name (not "exe")
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", error).string();
  if (error) return;
  const std::string before = current ? current : "";
  if (::setenv(kBefore, before.c_str(), 1) != 0 || ::setenv("GLIBC_TUNABLES", tunables->c_str(), 1) != 0)
    return put_back(before);
  ::execv(self.c_str(), argv);
  put_back(before);  // the restart failed: run on as we are
}

}  // namespace commsched
