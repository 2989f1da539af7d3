// A rendezvous store on a free loopback port (no secret), as server 0 serves it in a PS job, for tests whose nodes
// meet there: each node takes a client of its own, and a test that plays the servers by hand publishes their
// endpoints itself (published()), as the Van of each server would.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm_backends/collective/kv_store.h"
#include "comm_backends/control/store.h"

namespace commsched::control::test_support {

class TestStore {
 public:
  int port() const { return server_.port(); }
  std::unique_ptr<Store> client() const {
    return std::make_unique<collective::TcpStoreClient>("127.0.0.1", server_.port(), std::chrono::seconds(5));
  }
  // Server s's endpoint under "ps/server/<s>", and (when `assembled`) the key by which server 0 tells the workers
  // that the whole job has come.
  void publish(const std::vector<std::string>& endpoints, bool assembled) const {
    const auto c = client();
    for (size_t s = 0; s < endpoints.size(); ++s) c->set("ps/server/" + std::to_string(s), endpoints[s]);
    if (assembled) c->set("ps/assembled", "1");
  }

 private:
  collective::TcpStoreServer server_{"127.0.0.1", 0};
};

}  // namespace commsched::control::test_support
