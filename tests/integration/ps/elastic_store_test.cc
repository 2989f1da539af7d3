// Where node 0 serves an elastic run's membership store: where the control plane binds when --bind (horovodrun's
// --network-interface) names an address or an interface, not on every interface.
#include "plugins/launch/elastic_store.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace commsched {
namespace {

using Endpoint = ElasticStore::Endpoint;

TEST(ElasticStoreEndpoint, ItListensWhereTheControlPlaneBinds) {
  EXPECT_EQ(ElasticStore::endpoint("127.0.0.1", ""), (Endpoint{"127.0.0.1", "127.0.0.1"}));
  EXPECT_EQ(ElasticStore::endpoint("127.0.0.1", "10.1.2.9"), (Endpoint{"127.0.0.1", "127.0.0.1"}));  // one host
  EXPECT_EQ(ElasticStore::endpoint("10.1.2.3", ""), (Endpoint{"*", "10.1.2.3"}));
  EXPECT_EQ(ElasticStore::endpoint("10.1.2.3", "*"), (Endpoint{"*", "10.1.2.3"}));
  EXPECT_EQ(ElasticStore::endpoint("10.1.2.3", "10.1.2.9"), (Endpoint{"10.1.2.9", "10.1.2.9"}));
  EXPECT_EQ(ElasticStore::endpoint("10.1.2.3", "lo"), (Endpoint{"127.0.0.1", "127.0.0.1"}));  // an interface
  try {
    ElasticStore::endpoint("10.1.2.3", "no-such-if0");
    FAIL() << "a --bind that is neither an address nor an interface was taken";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-if0"), std::string::npos) << e.what();
  }
}

// Whether /proc/net/tcp lists a listening socket on exactly address:port (IPv4, as the kernel writes it).
bool listens_on(unsigned a, unsigned b, unsigned c, unsigned d, int port) {
  char want[32];
  std::snprintf(want, sizeof want, "%02X%02X%02X%02X:%04X", d, c, b, a, static_cast<unsigned>(port));
  std::ifstream in("/proc/net/tcp");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string slot, local, remote, state;
    f >> slot >> local >> remote >> state;
    if (local == want && state == "0A") return true;
  }
  return false;
}

// Served on one loopback address other than 127.0.0.1: it listens there only, and node 0's own client reaches it
// (it used to dial 127.0.0.1 whatever the store bound).
TEST(ElasticStoreEndpoint, AStoreServedOnOneAddressListensThereAndWorks) {
  auto store = ElasticStore::serve("127.0.0.2", "127.0.0.2", "", 1, 0);
  const std::string address = store->address();
  ASSERT_EQ(address.rfind("127.0.0.2:", 0), 0u) << address;
  const int port = std::stoi(address.substr(address.find(':') + 1));
  EXPECT_TRUE(listens_on(127, 0, 0, 2, port)) << address;
  EXPECT_FALSE(listens_on(0, 0, 0, 0, port)) << "listening on every interface";
  store->set_workers(0, {"a", "b"});
  EXPECT_EQ(store->alive(), 2);
}

}  // namespace
}  // namespace commsched
