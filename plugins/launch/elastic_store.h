// The membership store of an elastic run, served by `commsched launch --min-workers` so that it outlives every
// worker. The workers' side of the protocol (generations, registration, joiners) is python/commsched/_elastic.py;
// the launcher only says what it alone knows: which worker process has died, and when the run must stop.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace commsched {
namespace collective {
class TcpStoreServer;
class TcpStoreClient;
}  // namespace collective

// Keys shared with python/commsched/_elastic.py (its PREFIX, LOST and ABORT).
inline constexpr const char* kElasticPrefix = "commsched/elastic/";

class ElasticStore {
 public:
  // Node 0 (or the only node): serves the store on `bind` ("127.0.0.1", or "*" where other nodes must reach it) and
  // advertises it as host:port; `secret` is the run's (empty: authentication off), as the workers will prove it.
  // nnodes: how many launchers count their workers in it. Its port is below the kernel's ephemeral range (where a
  // root port a user took from bind(0) lies) and never `rendezvous_port` (bound later, by worker 0) or the port below
  // it (a multi-node root's, which node 0's launcher binds after this).
  static std::unique_ptr<ElasticStore> serve(const std::string& bind, const std::string& host,
                                             const std::string& secret, int nnodes, int rendezvous_port);
  // Where node 0 serves it (`bind`) and the host it advertises, for a run whose root is `root_host` and whose
  // processes bind `bind` (launch --bind; empty: unset): loopback for a loopback root; across nodes where the
  // control plane binds when --bind names an address or an interface (that interface's address), else every
  // interface, advertised as the root's host.
  struct Endpoint {
    std::string bind, host;
    bool operator==(const Endpoint&) const = default;
  };
  static Endpoint endpoint(const std::string& root_host, const std::string& bind);
  // Another node: node 0's store at `address` (HOST:PORT, as COMMSCHED_ELASTIC_STORE has it).
  static std::unique_ptr<ElasticStore> connect(const std::string& address, const std::string& secret, int nnodes);
  ~ElasticStore();
  // HOST:PORT for COMMSCHED_ELASTIC_STORE.
  std::string address() const { return address_; }
  // The worker with this COMMSCHED_ELASTIC_ID is gone: the survivors stop waiting for it when they re-form.
  void mark_lost(const std::string& id);
  // Every worker gives up with `why` (fewer workers than the minimum remain).
  void abort(const std::string& why);
  // The workers (their COMMSCHED_ELASTIC_IDs) that run on `node` now, as its launcher says; how many run on every node
  // together (what the minimum is judged against); and, from node 0, a node whose launcher is lost: its workers are
  // marked lost (the survivors need not wait for them) and count no more.
  void set_workers(int node, const std::vector<std::string>& ids);
  int alive() const;
  void node_lost(int node);

  // The latest generation the workers formed after the first: its number, its workers and the port its rendezvous
  // root (parameter server 0) binds. None while there is only the first, or when the last was an abort.
  struct Generation {
    int number = 0;
    int workers = 0;
    int root_port = 0;
  };
  std::optional<Generation> latest() const;

 private:
  ElasticStore(std::unique_ptr<collective::TcpStoreServer> server, const std::string& host, int port,
               const std::string& secret, int nnodes, bool host_is_any = false);

  std::unique_ptr<collective::TcpStoreServer> server_;  // node 0 only
  std::unique_ptr<collective::TcpStoreClient> client_;
  std::string address_;
  int nnodes_ = 1;
};

}  // namespace commsched
