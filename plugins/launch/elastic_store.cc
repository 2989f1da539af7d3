#include "plugins/launch/elastic_store.h"

#include <chrono>

#include "comm_backends/collective/kv_store.h"
#include "comm_backends/control/socket.h"
#include "plugins/launch/node_link.h"

namespace commsched {

ElasticStore::ElasticStore(std::unique_ptr<collective::TcpStoreServer> server, const std::string& host, int port,
                           const std::string& secret, int nnodes)
    : server_(std::move(server)),
      client_(std::make_unique<collective::TcpStoreClient>(server_ ? "127.0.0.1" : host, port,
                                                           std::chrono::seconds(10), secret)),
      address_(host + ":" + std::to_string(port)),
      nnodes_(nnodes) {}

std::unique_ptr<ElasticStore> ElasticStore::serve(const std::string& bind, const std::string& host,
                                                  const std::string& secret, int nnodes, int rendezvous_port) {
  int port = 0;
  do port = control::free_port(bind == "*" ? "0.0.0.0" : bind);
  while (port == rendezvous_port);
  auto server = std::make_unique<collective::TcpStoreServer>(bind, port, secret);
  return std::unique_ptr<ElasticStore>(new ElasticStore(std::move(server), host, port, secret, nnodes));
}

std::unique_ptr<ElasticStore> ElasticStore::connect(const std::string& address, const std::string& secret,
                                                    int nnodes) {
  const auto [host, port] = parse_host_port(address);
  return std::unique_ptr<ElasticStore>(new ElasticStore(nullptr, host, port, secret, nnodes));
}

ElasticStore::~ElasticStore() = default;

void ElasticStore::mark_lost(const std::string& id) { client_->set(std::string(kElasticPrefix) + "lost/" + id, "1"); }

void ElasticStore::abort(const std::string& why) { client_->set(std::string(kElasticPrefix) + "abort", why); }

// Keys of the launchers' own (python/commsched/_elastic.py never reads them).
void ElasticStore::set_alive(int node, int workers) {
  client_->set(std::string(kElasticPrefix) + "launcher/alive/" + std::to_string(node), std::to_string(workers));
}

int ElasticStore::alive() const {
  int n = 0;
  for (int node = 0; node < nnodes_; ++node) {
    const auto v = client_->try_get(std::string(kElasticPrefix) + "launcher/alive/" + std::to_string(node));
    n += v ? std::stoi(*v) : 0;  // a node yet to start its workers has none
  }
  return n;
}

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
