#include "plugins/launch/elastic_store.h"

#include <chrono>

#include "comm_backends/collective/kv_store.h"
#include "plugins/launch/process_group.h"

namespace commsched {

ElasticStore::ElasticStore(const std::string& secret)
    : server_(std::make_unique<collective::TcpStoreServer>("127.0.0.1", free_loopback_port(), secret)),
      client_(std::make_unique<collective::TcpStoreClient>("127.0.0.1", server_->port(), std::chrono::seconds(10),
                                                           secret)) {}

ElasticStore::~ElasticStore() = default;

std::string ElasticStore::address() const { return "127.0.0.1:" + std::to_string(server_->port()); }

void ElasticStore::mark_lost(const std::string& id) { client_->set(std::string(kElasticPrefix) + "lost/" + id, "1"); }

void ElasticStore::abort(const std::string& why) { client_->set(std::string(kElasticPrefix) + "abort", why); }

std::optional<ElasticStore::Generation> ElasticStore::latest() const {
  const std::string p = kElasticPrefix;
  if (!client_->contains(p + "current")) return std::nullopt;
  Generation g;
  g.number = std::stoi(client_->get(p + "current", std::chrono::seconds(1)));
  const std::string gen = p + "gen/" + std::to_string(g.number) + "/";
  if (g.number == 0 || !client_->contains(gen + "size")) return std::nullopt;
  g.workers = std::stoi(client_->get(gen + "size", std::chrono::seconds(1)));
  g.root_port = std::stoi(client_->get(gen + "port", std::chrono::seconds(1)));
  return g;
}

}  // namespace commsched
