// The membership store of an elastic run, served by `commsched launch --min-workers` so that it outlives every
// worker. The workers' side of the protocol (generations, registration, joiners) is python/commsched/_elastic.py;
// the launcher only says what it alone knows: which worker process has died, and when the run must stop.
#pragma once

#include <memory>
#include <optional>
#include <string>

namespace commsched {
namespace collective {
class TcpStoreServer;
class TcpStoreClient;
}  // namespace collective

// Keys shared with python/commsched/_elastic.py (its PREFIX, LOST and ABORT).
inline constexpr const char* kElasticPrefix = "commsched/elastic/";

class ElasticStore {
 public:
  // Serves the store on loopback; `secret` is the run's (empty: authentication off), as the workers will prove it.
  explicit ElasticStore(const std::string& secret);
  ~ElasticStore();
  // HOST:PORT for COMMSCHED_ELASTIC_STORE.
  std::string address() const;
  // The worker with this COMMSCHED_ELASTIC_ID is gone: the survivors stop waiting for it when they re-form.
  void mark_lost(const std::string& id);
  // Every worker gives up with `why` (fewer workers than the minimum remain).
  void abort(const std::string& why);

  // The latest generation the workers formed after the first: its number, its workers and the port its rendezvous
  // root (parameter server 0) binds. None while there is only the first, or when the last was an abort.
  struct Generation {
    int number = 0;
    int workers = 0;
    int root_port = 0;
  };
  std::optional<Generation> latest() const;

 private:
  std::unique_ptr<collective::TcpStoreServer> server_;
  std::unique_ptr<collective::TcpStoreClient> client_;
};

}  // namespace commsched
