// Happens-before edges ThreadSanitizer cannot see by itself: hand-offs through libraries that are not instrumented
// (Debian's libzmq pipes a zero-copy message to its I/O thread; oneTBB's scheduler runs tasks on its workers and wakes
// the waiting thread, so every flow-graph edge that spawns a task is such a hand-off too). `handed_over(p)` before the
// hand-off, `taken_over(p)` after it, with the same address. No-ops in normal builds.
#pragma once

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

namespace commsched {

#if defined(__SANITIZE_THREAD__)
inline void handed_over(const void* p) { __tsan_release(const_cast<void*>(p)); }
inline void taken_over(const void* p) { __tsan_acquire(const_cast<void*>(p)); }
#else
inline void handed_over(const void*) {}
inline void taken_over(const void*) {}
#endif

}  // namespace commsched
