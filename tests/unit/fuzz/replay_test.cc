// Every seed and every recorded finding of the fuzzers (tests/fuzz), replayed through the same entry points: a
// decoder that crashes, trips a property (abort) or allocates without bound on one of them fails this suite.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "comm_backends/collective/protocol.h"
#include "comm_backends/collective/wire.h"

int fuzz_ps_header(const uint8_t* data, size_t size);
int fuzz_collective_wire(const uint8_t* data, size_t size);
int fuzz_config(const uint8_t* data, size_t size);
int fuzz_profile_json(const uint8_t* data, size_t size);
int fuzz_stragglers(const uint8_t* data, size_t size);
int fuzz_link_auth(const uint8_t* data, size_t size);
int fuzz_node_link(const uint8_t* data, size_t size);

namespace fs = std::filesystem;

namespace {

using Target = int (*)(const uint8_t*, size_t);

// Runs every file of corpus/<name> and regressions/<name>; returns how many.
size_t replay(const std::string& name, Target target) {
  size_t n = 0;
  for (const char* kind : {"corpus", "regressions"}) {
    const fs::path dir = fs::path(COMMSCHED_FUZZ_DIR) / kind / name;
    if (!fs::exists(dir)) continue;
    for (const auto& e : fs::directory_iterator(dir)) {
      std::ifstream f(e.path(), std::ios::binary);
      const std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      SCOPED_TRACE(e.path().string());
      target(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++n;
    }
  }
  return n;
}

}  // namespace

TEST(FuzzReplay, PsHeader) { EXPECT_GE(replay("ps_header", fuzz_ps_header), 13u); }
TEST(FuzzReplay, CollectiveWire) { EXPECT_GE(replay("collective_wire", fuzz_collective_wire), 6u); }
TEST(FuzzReplay, Config) { EXPECT_GE(replay("config", fuzz_config), 18u); }
TEST(FuzzReplay, ProfileJson) { EXPECT_GE(replay("profile_json", fuzz_profile_json), 2u); }
TEST(FuzzReplay, Stragglers) { EXPECT_GE(replay("stragglers", fuzz_stragglers), 4u); }
TEST(FuzzReplay, LinkAuth) { EXPECT_GE(replay("link_auth", fuzz_link_auth), 4u); }
TEST(FuzzReplay, NodeLink) { EXPECT_GE(replay("node_link", fuzz_node_link), 4u); }

// Found by fuzz_collective_wire: a 9-byte ready frame claiming 8 million reports made decode_ready allocate them all
// (about 1 GB) before the reads failed. The count is now bounded by the bytes left in the frame.
TEST(FuzzRegression, HostileCountIsRefusedBeforeAllocating) {
  using namespace commsched::collective;
  std::string frame;
  frame.push_back(static_cast<char>(MsgType::ready));
  const uint32_t count = 0x00800000;
  frame.append(reinterpret_cast<const char*>(&count), sizeof count);
  ByteReader r(frame, "test frame");
  read_type(r);
  try {
    decode_ready(r);
    FAIL() << "a frame without room for its reports decoded";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit"), std::string::npos) << e.what();
  }
}
