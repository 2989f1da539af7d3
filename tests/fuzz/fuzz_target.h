// One fuzz entry point per file: `int fuzz_<name>(const uint8_t*, size_t)`. Built with -DCOMMSCHED_LIBFUZZER it
// becomes libFuzzer's LLVMFuzzerTestOneInput (scripts/fuzz.sh); otherwise the regression test in
// tests/unit/fuzz replays every corpus file and every recorded crash through it in the normal build.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#ifdef COMMSCHED_LIBFUZZER
#define COMMSCHED_FUZZ_TARGET(fn) \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return fn(data, size); }
#else
#define COMMSCHED_FUZZ_TARGET(fn)
#endif

// A property every input must keep; abort() makes libFuzzer record the input as a crash.
#define FUZZ_CHECK(cond) \
  do {                   \
    if (!(cond)) std::abort(); \
  } while (0)
