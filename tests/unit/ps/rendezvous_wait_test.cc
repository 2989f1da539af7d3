// A PS worker waits COMMSCHED_PS_RENDEZVOUS_TIMEOUT for the whole rendezvous, the store and the servers together: a
// store that comes up late leaves the wait for the servers only what is left, and the error names what was missing.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <exception>
#include <string>
#include <thread>

#include "comm_backends/collective/kv_store.h"
#include "comm_backends/control/socket.h"
#include "comm_backends/ps/ps_backend.h"

using namespace std::chrono_literals;
using namespace commsched;

TEST(PsRendezvousWait, TheWholeRendezvousWaitsTheTimeoutOnceAndNamesWhatWasMissing) {
  const int port = control::free_port("127.0.0.1");
  // Server 0's store comes up after 1.5 s of the 3 s timeout (1.5 s to spare for a loaded machine to connect), and
  // no server ever publishes its endpoint.
  std::unique_ptr<collective::TcpStoreServer> store;
  std::string store_error;
  std::thread late([&] {
    std::this_thread::sleep_for(1500ms);
    try {
      store = std::make_unique<collective::TcpStoreServer>("127.0.0.1", port);
    } catch (const std::exception& e) {  // the port taken meanwhile: say so instead of terminating
      store_error = e.what();
    }
  });
  ClusterEnv env;
  env.role = Role::worker;
  env.num_workers = 1;
  env.num_servers = 1;
  env.root_port = port;
  PsConfig cfg;
  cfg.transport = "zmq";
  cfg.rendezvous_timeout_s = 3;
  const auto t0 = std::chrono::steady_clock::now();
  std::string error;
  try {
    PsBackend backend(env, cfg);
  } catch (const std::runtime_error& e) {
    error = e.what();
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  late.join();
  ASSERT_TRUE(store_error.empty()) << "the test's store could not start: " << store_error;
  ASSERT_FALSE(error.empty()) << "the worker met a cluster that has no server";
  EXPECT_GE(waited, 2.9) << error;
  EXPECT_LT(waited, 4.0) << "waited the timeout again after the store came up: " << error;  // 4.5 s when it did
  const std::string at = "127.0.0.1:" + std::to_string(port);
  EXPECT_NE(error.find("waiting for server 0 to publish its endpoint"), std::string::npos) << error;
  EXPECT_NE(error.find("'ps/server/0' in the rendezvous store at " + at), std::string::npos) << error;
}
