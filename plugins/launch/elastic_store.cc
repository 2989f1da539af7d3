#include "plugins/launch/elastic_store.h"

#include <chrono>
#include <sstream>

#include "comm_backends/cluster_auth.h"
#include "comm_backends/cluster_env.h"
#include "comm_backends/collective/kv_store.h"
#include "comm_backends/control/socket.h"
#include "plugins/launch/node_link.h"

namespace commsched {

ElasticStore::ElasticStore(std::unique_ptr<collective::TcpStoreServer> server, const std::string& host, int port,
                           const std::string& secret, int nnodes, bool host_is_any)
    : server_(std::move(server)),
      // Node 0 dials its own store on loopback where it listens on every interface, else where it listens.
      client_(std::make_unique<collective::TcpStoreClient>(server_ && host_is_any ? "127.0.0.1" : host, port,
                                                           std::chrono::seconds(10), secret)),
      address_(host + ":" + std::to_string(port)),
      nnodes_(nnodes) {}

std::unique_ptr<ElasticStore> ElasticStore::serve(const std::string& bind, const std::string& host,
                                                  const std::string& secret, int nnodes, int rendezvous_port) {
  int port = 0;
  do port = control::free_port(bind == "*" ? "0.0.0.0" : bind);
  while (port == rendezvous_port || port == rendezvous_port - 1);  // nor the root's own port, just below
  auto server = std::make_unique<collective::TcpStoreServer>(bind, port, secret);
  return std::unique_ptr<ElasticStore>(new ElasticStore(std::move(server), host, port, secret, nnodes, bind == "*"));
}

ElasticStore::Endpoint ElasticStore::endpoint(const std::string& root_host, const std::string& bind) {
  if (is_loopback_host(root_host)) return {"127.0.0.1", "127.0.0.1"};
  if (bind.empty() || bind == "*") return {"*", root_host};
  ClusterEnv env;
  env.bind = bind;
  const std::string address = control::advertised_host(env);  // an interface's address; throws naming a bad one
  return {address, address};
}

std::unique_ptr<ElasticStore> ElasticStore::connect(const std::string& address, const std::string& secret,
                                                    int nnodes) {
  const auto [host, port] = parse_host_port(address);
  return std::unique_ptr<ElasticStore>(new ElasticStore(nullptr, host, port, secret, nnodes));
}

ElasticStore::~ElasticStore() = default;

void ElasticStore::mark_lost(const std::string& id) { client_->set(std::string(kElasticPrefix) + "lost/" + id, "1"); }

void ElasticStore::abort(const std::string& why) { client_->set(std::string(kElasticPrefix) + "abort", why); }

// Keys of the launchers' own (python/commsched/_elastic.py never reads them): a node's running workers' ids, one per
// line ("" for none, as for a node yet to start its workers).
namespace {
std::string workers_key(int node) { return std::string(kElasticPrefix) + "launcher/workers/" + std::to_string(node); }

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(line);
  return out;
}
}  // namespace

void ElasticStore::set_workers(int node, const std::vector<std::string>& ids) {
  std::string text;
  for (const std::string& id : ids) text += id + "\n";
  client_->set(workers_key(node), text);
}

int ElasticStore::alive() const {
  size_t n = 0;
  for (int node = 0; node < nnodes_; ++node) n += split_lines(client_->try_get(workers_key(node)).value_or("")).size();
  return static_cast<int>(n);
}

void ElasticStore::node_lost(int node) {
  for (const std::string& id : split_lines(client_->try_get(workers_key(node)).value_or(""))) mark_lost(id);
  set_workers(node, {});
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
