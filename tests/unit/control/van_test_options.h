// The Van options the control-plane tests start from: loopback addresses, a 2 s silence limit. One place for both
// test files (over real transports in van_test.cc, over a scripted one in van_goodbye_test.cc); their nodes meet at a
// test_store.h store.
#pragma once

#include <cstdint>
#include <string>

#include "comm_backends/control/van.h"
#include "tests/unit/control/test_store.h"

namespace commsched::control::test_support {

inline VanOptions van_test_options(PeerRole role, uint32_t rank, int workers, int servers) {
  VanOptions o;
  o.role = role;
  o.rank = rank;
  o.num_workers = workers;
  o.num_servers = servers;
  o.bind_host = "127.0.0.1";
  o.advertised_host = "127.0.0.1";
  o.timeout_s = 2;
  o.rendezvous_timeout_s = 20;
  return o;
}

}  // namespace commsched::control::test_support
