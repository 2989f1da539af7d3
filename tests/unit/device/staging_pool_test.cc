// StagingPool: size classes, reuse of returned buffers, distinct buffers for concurrent leases.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "scheduler/stages/host_copier.h"
#include "scheduler/stages/staging_pool.h"

namespace commsched {
namespace {

TEST(StagingPool, ClassesArePowersOfTwoFromTheMinimum) {
  EXPECT_EQ(StagingPool::class_bytes(0), StagingPool::kMinClassBytes);
  EXPECT_EQ(StagingPool::class_bytes(1), StagingPool::kMinClassBytes);
  EXPECT_EQ(StagingPool::class_bytes(4096), 4096u);
  EXPECT_EQ(StagingPool::class_bytes(4097), 8192u);
  EXPECT_EQ(StagingPool::class_bytes((1u << 20) + 3), 2u << 20);
}

TEST(StagingPool, AReturnedBufferServesTheNextLeaseOfItsClass) {
  auto copier = std::make_shared<HostCopier>();
  auto pool = StagingPool::make(copier);
  std::byte* first = nullptr;
  {
    StagingBuffer b = pool->acquire(5000);
    first = b.data();
    EXPECT_EQ(b.capacity(), 8192u);
    EXPECT_EQ(pool->stats().leased, 1u);
  }
  EXPECT_EQ(pool->stats().leased, 0u);
  for (int i = 0; i < 10; ++i) {
    StagingBuffer b = pool->acquire(6000 + i);  // same class
    EXPECT_EQ(b.data(), first);
  }
  StagingBuffer other = pool->acquire(100000);  // another class: a new buffer
  EXPECT_NE(other.data(), first);
  const StagingStats s = pool->stats();
  EXPECT_EQ(s.allocations, 2u);
  EXPECT_EQ(s.leases, 12u);
  EXPECT_EQ(s.bytes_held, 8192u + 131072u);
  EXPECT_EQ(copier->allocations(), 2u);
}

TEST(StagingPool, ConcurrentLeasesGetDistinctBuffersAndThePoolFreesThemAll) {
  auto copier = std::make_shared<HostCopier>();
  {
    auto pool = StagingPool::make(copier);
    std::vector<StagingBuffer> held;
    std::set<std::byte*> seen;
    for (int i = 0; i < 8; ++i) {
      held.push_back(pool->acquire(4096));
      seen.insert(held.back().data());
    }
    EXPECT_EQ(seen.size(), 8u);
    held.clear();
    for (int i = 0; i < 8; ++i) held.push_back(pool->acquire(4096));  // all eight come back from the free list
    EXPECT_EQ(pool->stats().allocations, 8u);
  }  // the leases went first; the pool frees what it holds
  EXPECT_EQ(copier->frees(), copier->allocations());
  EXPECT_EQ(copier->allocations(), 8u);
}

TEST(StagingPool, ALeaseKeepsThePoolAlive) {
  auto copier = std::make_shared<HostCopier>();
  StagingBuffer b;
  {
    auto pool = StagingPool::make(copier);
    b = pool->acquire(10);
  }
  EXPECT_EQ(copier->frees(), 0u);
  b.release();
  EXPECT_EQ(copier->frees(), 1u);
}

TEST(StagingPool, ADevicePoolAllocatesOnItsDeviceAndReusesLikeAHostPool) {
  auto copier = std::make_shared<HostCopier>();
  {
    auto pool = StagingPool::make(copier, StagingMemory::device(2));
    std::byte* first = pool->acquire(3000).data();
    EXPECT_EQ(pool->acquire(4000).data(), first);
    EXPECT_EQ(pool->stats().allocations, 1u);
    EXPECT_EQ(copier->device_allocations(), 1u);
    EXPECT_EQ(copier->allocations(), 0u) << "a device pool took pinned host memory";
  }
  EXPECT_EQ(copier->device_frees(), 1u);
  EXPECT_EQ(copier->frees(), 0u);
}

}  // namespace
}  // namespace commsched
