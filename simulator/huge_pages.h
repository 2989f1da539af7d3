// The simulator's allocator on huge pages: a simulation with hundreds of workers reads a hundred MiB or so in no order,
// and with 4 KiB pages most of its cache misses miss the TLB as well (a 256-worker PS cell ran in 0.73x the CPU with
// huge pages). glibc backs its heap with transparent huge pages only when told so at startup (the tunable
// glibc.malloc.hugetlb=1; ignored where THP is off or glibc predates it), so the executables that simulate
// (commsched-sim, and `commsched bench`) start themselves once more with it set.
#pragma once

#include <optional>
#include <string>

namespace commsched {

// The GLIBC_TUNABLES value to restart with, given the current one (null: unset); nullopt when it names
// glibc.malloc.hugetlb already (set by the user, whose choice stands).
std::optional<std::string> tunables_with_huge_pages(const char* current);

// Replaces this process with its own executable (same argv, so it keeps its name) with GLIBC_TUNABLES asking for huge
// pages. Returns, and the process runs on as it is, when they are asked for already or the restart is not possible.
// Called again in the restarted process, it puts GLIBC_TUNABLES back as the user had it (glibc has read it by then),
// so that the processes a bench starts (real clusters, scripts) run as they would have.
void restart_with_huge_pages(char** argv);

}  // namespace commsched
