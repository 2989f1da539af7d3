// Standalone `commsched-sim bench ...`: the same subcommand the commsched executable carries, for runs without it.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "simulator/bench_cli.h"
#include "base/types.h"

namespace {

// A simulation with hundreds of workers reads a hundred MiB or so in no order: with 4 KiB pages most of its cache misses
// miss the TLB as well (a 256-worker PS cell ran in 0.73x the CPU with huge pages). glibc backs its heap with
// transparent huge pages only when told so at startup (the tunable glibc.malloc.hugetlb=1; ignored where THP is off
// or glibc predates it), so the simulator starts itself once more with it set. Where that fails, it runs as it is.
void restart_with_huge_pages(char** argv) {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  std::string set = tunables ? tunables : "";
  if (set.find("glibc.malloc.hugetlb") != std::string::npos) return;  // set already (by us, or by the user)
  set += std::string(set.empty() ? "" : ":") + "glibc.malloc.hugetlb=1";
  std::error_code error;  // the executable's own path, so that the process keeps its name (not "exe")
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", error).string();
  if (error || setenv("GLIBC_TUNABLES", set.c_str(), 1) != 0) return;
  execv(self.c_str(), argv);
}

}  // namespace

int main(int argc, char** argv) {
  restart_with_huge_pages(argv);
  CLI::App app{"commsched simulator benchmarks"};
  app.require_subcommand(1);
  commsched::add_bench_subcommand(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::cerr << "commsched-sim: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
