// The rendezvous key-value store (control::Store over TCP). Rank 0 serves it at COMMSCHED_ROOT_ADDR:COMMSCHED_ROOT_PORT
// (the ClusterEnv contract; in a parameter-server job, server 0 does); every rank, rank 0 included, is a client.
// Gloo's connectFullMesh, NCCL's unique id, the negotiator's endpoint and the PS servers' endpoints all meet here.
//
// Authentication (a non-empty shared secret, comm_backends/cluster_auth.h): before any request, server and client
// prove to each other that they know the secret (HMAC-SHA256 over fresh nonces of both sides, with a key derived from
// the secret); a client that cannot is logged and disconnected before it can read or write a single key.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm_backends/collective/wire.h"
#include "comm_backends/control/store.h"

namespace commsched {
struct ClusterEnv;
}

namespace commsched::collective {

// Serves the store from a background thread. Binds at construction (throws naming the address when it cannot).
class TcpStoreServer {
 public:
  TcpStoreServer(const std::string& host, int port, std::string secret = {});
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  int port() const { return port_; }

 private:
  struct Client;
  void run();
  void accept_clients(std::vector<std::unique_ptr<Client>>& clients);
  // Returns false when the client must be dropped (closed or malformed).
  bool serve(Client& c);
  // The client's answer to our challenge; false (logged) when it does not prove the secret.
  bool admit(Client& c, const std::string& frame);
  std::string handle(const std::string& request);

  Fd listener_;
  Fd wake_[2];
  int port_ = 0;
  std::string secret_;
  std::map<std::string, std::string> data_;  // only touched by the server thread
  std::thread thread_;
};

// The control plane's Store (comm_backends/control/store.h) over a connection to a TcpStoreServer.
class TcpStoreClient : public control::Store {
 public:
  // Connects, retrying until `connect_timeout` (rank 0's server may start a little later), and proves the secret
  // within the same time (and at most 10 s after connecting); throws naming the store's address.
  TcpStoreClient(const std::string& host, int port, std::chrono::milliseconds connect_timeout,
                 const std::string& secret = {});
  void set(const std::string& key, const std::string& value) override;
  std::optional<std::string> try_get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string where() const override { return where_; }

 private:
  std::string round_trip(const std::string& frame);

  std::mutex mu_;
  Fd fd_;
  std::string where_;
};

// The store every rank of a collective backend uses: rank 0 also owns the server. Keys are prefixed with `scope` so two
// backends (or two test cases) sharing a root port do not collide; an elastic job's later generations
// (ClusterEnv::generation) add "genN/", so a re-formed group never reads the keys of an earlier one. A process set's
// sub-cluster (ClusterEnv::store_scope set) serves nothing: its members are clients of the job's one store, under
// "<store_scope>[genN/]<scope>".
class Rendezvous {
 public:
  Rendezvous(const ClusterEnv& env, std::string scope);
  // The same with the server owned by whoever `serves` (the parameter server's: server 0, not rank 0 of each role),
  // and clients that wait `connect_timeout` for it to come up.
  Rendezvous(const ClusterEnv& env, std::string scope, bool serves, std::chrono::milliseconds connect_timeout);
  control::Store& store() { return *client_; }
  // Prefix applied to every key of this rendezvous.
  const std::string& scope() const { return scope_; }
  // When this node began to meet the others (before waiting for the store): what comes after (the Van's wait for
  // the other nodes) counts its timeout from here, so that the whole rendezvous waits the timeout once.
  std::chrono::steady_clock::time_point began() const { return began_; }

 private:
  std::chrono::steady_clock::time_point began_ = std::chrono::steady_clock::now();  // first: before the store
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<TcpStoreClient> client_;
  std::string scope_;
};

// A process set's members (ClusterEnv::store_scope set) learn which of them share a host: each publishes the address
// it reaches the store from under "<store_scope>[genN/]host/<rank>", and local_rank / local_size count the members
// with its own address. Throws naming the store and the members missing at the deadline; InvalidArgument without a
// store_scope.
void place_on_hosts(ClusterEnv& env);

}  // namespace commsched::collective
