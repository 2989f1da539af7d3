// The PS buffer pool: size classes reused, big buffers cut from 2 MiB-aligned regions advised as huge pages.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "comm_backends/ps/buffer_pool.h"

namespace commsched::ps {
namespace {

constexpr uintptr_t kHugePage = 2 << 20;
uintptr_t addr(const std::shared_ptr<std::byte>& p) { return reinterpret_cast<uintptr_t>(p.get()); }

// The VmFlags line of the mapping in /proc/self/smaps that holds `a` ("" when none does).
std::string vm_flags_at(uintptr_t a) {
  std::ifstream smaps("/proc/self/smaps");
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') inside = lo <= a && a < hi;
    else if (inside && line.starts_with("VmFlags:")) return line;
  }
  return "";
}

TEST(PsBufferPool, SmallBuffersAreAlignedAndReused) {
  auto pool = BufferPool::create();
  uintptr_t first;
  {
    auto a = pool->acquire(3000);
    first = addr(a);
    EXPECT_EQ(first % 64, 0u);
    EXPECT_EQ(pool->allocated_bytes(), 4096u);  // the smallest class
  }
  EXPECT_EQ(addr(pool->acquire(4000)), first);  // back in its class, handed out again
  EXPECT_EQ(pool->allocated_bytes(), 4096u);
}

TEST(PsBufferPool, BigBuffersShareAHugePageRegion) {
  auto pool = BufferPool::create();
  auto a = pool->acquire(1 << 20), b = pool->acquire(1 << 20);
  EXPECT_EQ(pool->allocated_bytes(), kHugePage);  // one region, two buffers of it
  EXPECT_EQ(addr(a) % kHugePage, 0u);
  EXPECT_EQ(addr(b), addr(a) + (1 << 20));
  std::memset(a.get(), 1, 1 << 20);  // both whole and writable
  std::memset(b.get(), 2, 1 << 20);
  EXPECT_EQ(static_cast<int>(a.get()[(1 << 20) - 1]), 1);
  auto c = pool->acquire(1 << 20);  // the region is used up: a second one
  EXPECT_EQ(pool->allocated_bytes(), 2 * kHugePage);
  EXPECT_EQ(addr(c) % kHugePage, 0u);
}

TEST(PsBufferPool, BuffersOverAHugePageAreAlignedAdvisedAndReused) {
  auto pool = BufferPool::create();
  uintptr_t first;
  {
    auto a = pool->acquire(3 << 20);  // class 4 MiB
    first = addr(a);
    EXPECT_EQ(first % kHugePage, 0u);
    EXPECT_EQ(pool->allocated_bytes(), 4u << 20);
    std::memset(a.get(), 7, 4 << 20);
    // "hg": madvise(MADV_HUGEPAGE) holds for the mapping (whether the kernel finds huge pages is its own business).
    EXPECT_NE(vm_flags_at(first).find(" hg"), std::string::npos) << vm_flags_at(first);
  }
  EXPECT_EQ(addr(pool->acquire(4 << 20)), first);
  EXPECT_EQ(pool->allocated_bytes(), 4u << 20);
}

}  // namespace
}  // namespace commsched::ps
