#include "comm_backends/collective/kv_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <span>
#include <stdexcept>

#include "base/types.h"
#include "comm_backends/cluster_auth.h"
#include "comm_backends/cluster_env.h"
#include "comm_backends/collective/link_auth.h"
#include "comm_backends/collective/wire.h"

namespace commsched::collective {
namespace {

enum class StoreOp : uint8_t { set = 1, get = 2, add = 3 };

std::chrono::milliseconds to_ms(double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); }

// How long a member waits for the store and for the others: the slowest member may still be starting its process.
std::chrono::milliseconds rendezvous_wait(const ClusterEnv& env) { return to_ms(std::max(30.0, 3 * env.timeout_s)); }

}  // namespace

struct TcpStoreServer::Client {
  Fd fd;
  FrameAssembler in;
  std::optional<LinkAuth> auth;  // until the client proved the secret (none: the store does not authenticate)
};

TcpStoreServer::TcpStoreServer(const std::string& host, int port, std::string secret) : secret_(std::move(secret)) {
  listener_ = listen_tcp(host, port);
  port_ = bound_port(listener_.get());
  set_nonblocking(listener_.get(), true);
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error("rendezvous store: pipe2 failed");
  wake_[0].reset(p[0]);
  wake_[1].reset(p[1]);
  thread_ = std::thread([this] { run(); });
}

TcpStoreServer::~TcpStoreServer() {
  const char b = 1;
  [[maybe_unused]] const ssize_t n = ::write(wake_[1].get(), &b, 1);
  if (thread_.joinable()) thread_.join();
}

void TcpStoreServer::run() {
  std::vector<std::unique_ptr<Client>> clients;
  for (;;) {
    std::vector<pollfd> fds{{wake_[0].get(), POLLIN, 0}, {listener_.get(), POLLIN, 0}};
    for (auto& c : clients) fds.push_back({c->fd.get(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), -1) < 0) continue;  // EINTR
    if (fds[0].revents) return;
    const size_t polled = clients.size();
    if (fds[1].revents) accept_clients(clients);
    std::vector<std::unique_ptr<Client>> alive;
    for (size_t i = 0; i < clients.size(); ++i) {
      const bool ready = i < polled && fds[i + 2].revents != 0;  // clients accepted just now have no pollfd yet
      if (!ready || serve(*clients[i])) alive.push_back(std::move(clients[i]));
    }
    clients = std::move(alive);
  }
}

void TcpStoreServer::accept_clients(std::vector<std::unique_ptr<Client>>& clients) {
  for (;;) {
    Fd fd = accept_tcp(listener_.get());
    if (!fd.valid()) return;
    tune_control_socket(fd.get(), 10.0);
    auto c = std::make_unique<Client>();
    c->fd = std::move(fd);
    if (!secret_.empty()) {
      c->auth.emplace(secret_, "store", "rendezvous store");
      try {  // a client that does not authenticate reads the challenge as "key not found", never as a value
        send_all(c->fd.get(), c->auth->challenge(), "rendezvous store challenge");
      } catch (const std::exception&) {
        continue;  // gone already
      }
    }
    clients.push_back(std::move(c));
  }
}

bool TcpStoreServer::serve(Client& c) {
  char buf[65536];
  const ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
  if (n == 0) return false;
  if (n < 0) return errno == EAGAIN || errno == EINTR;
  c.in.append(buf, static_cast<size_t>(n));
  try {
    std::string frame;
    while (c.in.next(frame, "rendezvous store client", c.auth ? kMaxHandshakeFrame : kMaxFrameBytes)) {
      if (c.auth) {
        if (!admit(c, frame)) return false;
        continue;
      }
      send_all(c.fd.get(), handle(frame), "rendezvous store reply");
    }
  } catch (const std::exception&) {
    if (c.auth) admit(c, {});  // logs the refusal
    return false;  // a malformed or vanished client only loses its own connection
  }
  return true;
}

bool TcpStoreServer::admit(Client& c, const std::string& frame) {
  const auto reply = c.auth->reply_to(frame);
  if (!reply) {
    c.auth->refuse(c.fd.get());
    return false;
  }
  c.auth.reset();
  send_all(c.fd.get(), *reply, "rendezvous store authentication reply");
  return true;
}

std::string TcpStoreServer::handle(const std::string& request) {
  ByteReader r(request, "rendezvous store request");
  const auto op = static_cast<StoreOp>(r.get<uint8_t>());
  const std::string key = r.get_string();
  ByteWriter w;
  if (op == StoreOp::set) {
    data_[key] = r.get_string();
    w.put<uint8_t>(1);
  } else if (op == StoreOp::get) {
    auto it = data_.find(key);
    w.put<uint8_t>(it != data_.end());
    if (it != data_.end()) w.put_string(it->second);
  } else if (op == StoreOp::add) {
    const int64_t delta = r.get<int64_t>();
    std::string& value = data_[key];
    const int64_t sum = (value.empty() ? 0 : std::stoll(value)) + delta;
    value = std::to_string(sum);
    w.put<int64_t>(sum);
  } else {
    throw std::runtime_error("rendezvous store: unknown operation");
  }
  return w.take_frame();
}

TcpStoreClient::TcpStoreClient(const std::string& host, int port, std::chrono::milliseconds connect_timeout,
                               const std::string& secret)
    : where_("rendezvous store at " + host + ":" + std::to_string(port)) {
  const auto deadline = std::chrono::steady_clock::now() + connect_timeout;
  fd_ = connect_tcp(host, port, deadline);
  tune_control_socket(fd_.get(), 30.0);
  // A store that does not authenticate never sends the challenge: wait for it within the caller's deadline (a store
  // that accepts late must not stretch the rendezvous past it), and never more than 10 s.
  const auto challenge_deadline = std::min(deadline, std::chrono::steady_clock::now() + std::chrono::seconds(10));
  LinkAuth(secret, "store").prove(fd_.get(), challenge_deadline, where_);
}

std::string TcpStoreClient::round_trip(const std::string& frame) {
  std::lock_guard lock(mu_);
  send_all(fd_.get(), frame, where_);
  return recv_frame(fd_.get(), where_);
}

void TcpStoreClient::set(const std::string& key, const std::string& value) {
  ByteWriter w;
  w.put<uint8_t>(static_cast<uint8_t>(StoreOp::set));
  w.put_string(key);
  w.put_string(value);
  const std::string reply = round_trip(w.take_frame());
  // The reply to a set is {1}; a store that wants the secret answers its challenge {0, nonce} instead.
  if (reply.empty() || reply[0] == 0) throw std::runtime_error(where_ + " " + kNeedsSecret);
}

std::optional<std::string> TcpStoreClient::try_get(const std::string& key) {
  ByteWriter w;
  w.put<uint8_t>(static_cast<uint8_t>(StoreOp::get));
  w.put_string(key);
  const std::string reply = round_trip(w.take_frame());
  ByteReader r(reply, where_);
  if (r.get<uint8_t>() == 0) {
    if (!r.done()) throw std::runtime_error(where_ + " " + kNeedsSecret);  // its challenge: we have no secret
    return std::nullopt;
  }
  return r.get_string();
}

int64_t TcpStoreClient::add(const std::string& key, int64_t delta) {
  ByteWriter w;
  w.put<uint8_t>(static_cast<uint8_t>(StoreOp::add));
  w.put_string(key);
  w.put<int64_t>(delta);
  const std::string reply = round_trip(w.take_frame());
  ByteReader r(reply, where_);
  return r.get<int64_t>();
}

// Workers may start well before rank 0; give them several timeouts to find it.
Rendezvous::Rendezvous(const ClusterEnv& env, std::string scope)
    : Rendezvous(env, std::move(scope), env.rank == 0, rendezvous_wait(env)) {}

Rendezvous::Rendezvous(const ClusterEnv& env, std::string scope, bool serves, std::chrono::milliseconds connect_timeout)
    : scope_(env.store_scope + (env.generation == 0 ? std::string() : "gen" + std::to_string(env.generation) + "/") +
             scope) {
  const std::string secret = ClusterAuth::from_env().secret_for(env.root_addr);  // the store binds the root address
  if (serves && env.store_scope.empty()) server_ = std::make_unique<TcpStoreServer>(env.root_addr, env.root_port, secret);
  client_ = std::make_unique<TcpStoreClient>(env.root_addr, env.root_port, connect_timeout, secret);
}

void place_on_hosts(ClusterEnv& env) {
  if (env.store_scope.empty())
    throw InvalidArgument("place_on_hosts: the cluster has no store_scope (only a process set's members meet this way)");
  Rendezvous rendezvous(env, "host/");
  const std::string mine = control::advertised_host(env);
  const auto hosts = control::exchange(rendezvous.store(), rendezvous.scope(), env.rank, env.num_workers, mine,
                                       std::chrono::steady_clock::now() + rendezvous_wait(env));
  env.local_rank = static_cast<int>(std::count(hosts.begin(), hosts.begin() + env.rank, mine));
  env.local_size = static_cast<int>(std::count(hosts.begin(), hosts.end(), mine));
}

}  // namespace commsched::collective
